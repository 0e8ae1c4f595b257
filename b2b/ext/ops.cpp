// b2b's C kernels for MLX's CPU backend (../cpu_attention.c, ../cpu_layernorm.c,
// ../cpu_vocab_loss.c, ../cpu_adamw.c: AdamW and a sum of squares, ../cpu_gelu.c, ../cpu_dropout.c) as MLX primitives,
// so that they run inside MLX's graph: under mx.compile and value_and_grad like any op, in
// training too. (Calling C on numpy views instead evaluates arrays mid-graph, which MLX cannot
// compile and which keeps every array of a traced training step alive.)
//
// attention(q, k, v, key_mask, causal) -> out: q already scaled, (B, H, Tq, D); k, v
// (B, H, Tk, D); key_mask (B or 1, Tk) bool or None. The forward primitive has a second
// output, each row's log-normaliser (B, H, Tq, 1), which only the backward primitive reads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <optional>
#include <stdexcept>
#include <typeinfo>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace nb = nanobind;
namespace mx = mlx::core;

// The builders (defined at the end), which the primitives' vmap call on the mapped inputs.
std::vector<mx::array> attention_outputs(std::vector<mx::array> inputs, bool causal);
std::vector<mx::array> layer_norm_outputs(const mx::array& x, const mx::array& w, const mx::array& b, float eps);
mx::array gelu(const mx::array& x);
mx::array dropout(const mx::array& x, const mx::array& seed, float keep);
using Mapped = std::pair<std::vector<mx::array>, std::vector<int>>;  // vmap's outputs and their mapped axes

extern "C" {
int b2b_attention_forward(const float* q, const long* qs, const float* k, const long* ks, const float* v,
                          const long* vs, const uint8_t* key_mask, long mask_b, int causal, int B, int H, int Tq,
                          int Tk, int D, float* out, float* lse);
int b2b_attention_backward(const float* q, const long* qs, const float* k, const long* ks, const float* v,
                           const long* vs, const uint8_t* key_mask, long mask_b, int causal, int B, int H, int Tq,
                           int Tk, int D, const float* out, const float* lse, const float* dout, const long* ds,
                           float* dq, float* dk, float* dv);
void b2b_set_threads(int n);
void b2b_layer_norm_forward(const float* x, const float* w, const float* b, long rows, int C, float eps, float* y,
                            float* mean, float* rstd);
int b2b_layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                            long rows, int C, float* dx, float* dw, float* db);
void b2b_adamw(const float* p, const float* g, const float* m, const float* v, long n, const float* coef,
               const float* hyper, float* p_out, float* m_out, float* v_out);
double b2b_sum_squares(const float* const* xs, const long* ns, int count);
void b2b_gelu_forward(const float* x, long n, float* y);
void b2b_gelu_backward(const float* x, const float* dy, long n, float* dx);
void b2b_dropout(const float* src, long n, const uint32_t* seed, uint32_t threshold, float scale, float* dst);
void b2b_set_sgemm(void* fn);
int b2b_has_sgemm(void);
int b2b_vocab_loss_forward(const float* h, const float* W, const float* bias, const int32_t* labels,
                           const float* weights, long N, int C, int V, float smoothing, float* loss, float* lse,
                           float* logits);
int b2b_vocab_loss_backward(const float* h, const float* W, const int32_t* labels, const float* weights,
                            const float* logits, const float* lse, const float* cot, long N, int C, int V,
                            float smoothing, float* dh, float* dW, float* dbias);
}

namespace {

// A (B, H, T, D) input as the kernel reads it: its data and the strides of its first three
// dimensions in elements. The kernel needs D contiguous, as the usual transposed (B, T, H, D)
// views have it; anything else is copied (`packed`) inside the task, when the data is ready.
struct View {
  const float* data;
  long strides[4];
  int shape[4];
};

View view(const mx::array& a) {
  View v{a.data<float>(), {}, {}};
  for (int i = 0; i < 4; i++) v.strides[i] = (long)a.strides(i), v.shape[i] = a.shape(i);
  return v;
}

// `v` itself, or a row-contiguous copy held by `store` when its last stride is not 1.
View packed(const View& v, std::vector<float>& store) {
  if (v.strides[3] == 1) return v;
  store.resize((size_t)v.shape[0] * v.shape[1] * v.shape[2] * v.shape[3]);
  size_t n = 0;
  for (int a = 0; a < v.shape[0]; a++)
    for (int b = 0; b < v.shape[1]; b++)
      for (int c = 0; c < v.shape[2]; c++)
        for (int d = 0; d < v.shape[3]; d++)
          store[n++] = v.data[a * v.strides[0] + b * v.strides[1] + c * v.strides[2] + d * v.strides[3]];
  View out{store.data(), {}, {v.shape[0], v.shape[1], v.shape[2], v.shape[3]}};
  out.strides[3] = 1;
  out.strides[2] = v.shape[3];
  out.strides[1] = (long)v.shape[2] * v.shape[3];
  out.strides[0] = (long)v.shape[1] * out.strides[1];
  return out;
}

// Key mask pointer and batch stride (0: one row for every batch entry), or null.
std::pair<const uint8_t*, long> mask_of(const std::vector<mx::array>& inputs, size_t index) {
  if (inputs.size() <= index) return {nullptr, 0};
  const auto& m = inputs[index];
  return {m.data<uint8_t>(), m.shape(0) == 1 ? 0 : (long)m.strides(0)};
}

// Outputs allocated and registered with the stream's encoder, which the task is queued on.
mx::cpu::CommandEncoder& prepare(mx::Primitive& p, const std::vector<mx::array>& in, std::vector<mx::array>& outs) {
  for (auto& o : outs) o.set_data(mx::allocator::malloc(o.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(p.stream());
  for (auto& a : in) enc.set_input_array(a);
  for (auto& o : outs) enc.set_output_array(o);
  return enc;
}

// What every b2b primitive shares: CPU only; equal when of one kind and one setting.
class CpuPrimitive : public mx::Primitive {
 public:
  CpuPrimitive(mx::Stream s, float setting) : mx::Primitive(s), setting_(setting) {}
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string(name()) + " runs on the CPU only");
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(*this) == typeid(other) && setting_ == static_cast<const CpuPrimitive&>(other).setting_;
  }

 protected:
  float setting_;  // attention: causal (1) or not (0); layer norm: eps; GELU: none (0); dropout: keep probability
};

// The attention primitives' setting is the causal flag.
class AttentionPrimitive : public CpuPrimitive {
 public:
  AttentionPrimitive(mx::Stream s, bool causal) : CpuPrimitive(s, causal ? 1.f : 0.f), causal_(causal) {}

 protected:
  bool causal_;
};

class AttentionBackward : public AttentionPrimitive {
 public:
  using AttentionPrimitive::AttentionPrimitive;

  // inputs: q, k, v, out, lse, dout[, key_mask]; outputs: dq, dk, dv (contiguous).
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    View q0 = view(in[0]), k0 = view(in[1]), v0 = view(in[2]), d0 = view(in[5]);
    auto [mask, mask_b] = mask_of(in, 6);
    int B = in[0].shape(0), H = in[0].shape(1), Tq = in[0].shape(2), Tk = in[1].shape(2), D = in[0].shape(3);
    const float *out = in[3].data<float>(), *lse = in[4].data<float>();
    float *dq = outs[0].data<float>(), *dk = outs[1].data<float>(), *dv = outs[2].data<float>();
    bool causal = causal_;
    enc.dispatch([=]() {
      std::vector<float> sq, sk, sv, sd;
      View q = packed(q0, sq), k = packed(k0, sk), v = packed(v0, sv), d = packed(d0, sd);
      if (b2b_attention_backward(q.data, q.strides, k.data, k.strides, v.data, v.strides, mask, mask_b, causal, B, H,
                                 Tq, Tk, D, out, lse, d.data, d.strides, dq, dk, dv) != 0)
        throw std::runtime_error("b2b attention backward: out of memory");
    });
  }
  const char* name() const override { return "B2BAttentionBackward"; }
};

class AttentionForward : public AttentionPrimitive {
 public:
  using AttentionPrimitive::AttentionPrimitive;

  // inputs: q, k, v[, key_mask]; outputs: out (B, H, Tq, D), lse (B, H, Tq, 1).
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    View q0 = view(in[0]), k0 = view(in[1]), v0 = view(in[2]);
    auto [mask, mask_b] = mask_of(in, 3);
    int B = in[0].shape(0), H = in[0].shape(1), Tq = in[0].shape(2), Tk = in[1].shape(2), D = in[0].shape(3);
    float *out = outs[0].data<float>(), *lse = outs[1].data<float>();
    bool causal = causal_;
    enc.dispatch([=]() {
      std::vector<float> sq, sk, sv;
      View q = packed(q0, sq), k = packed(k0, sk), v = packed(v0, sv);
      if (b2b_attention_forward(q.data, q.strides, k.data, k.strides, v.data, v.strides, mask, mask_b, causal, B, H,
                                Tq, Tk, D, out, lse) != 0)
        throw std::runtime_error("b2b attention forward: out of memory");
    });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override {
    // The log-normaliser is internal (the Python function returns only `out`): its cotangent
    // is zero and ignored.
    std::vector<mx::array> inputs = {primals[0], primals[1], primals[2], outputs[0], outputs[1], cotangents[0]};
    if (primals.size() > 3) inputs.push_back(primals[3]);
    auto grads = mx::array::make_arrays({primals[0].shape(), primals[1].shape(), primals[2].shape()},
                                        {mx::float32, mx::float32, mx::float32},
                                        std::make_shared<AttentionBackward>(stream(), causal_), inputs);
    std::vector<mx::array> result;
    for (int i : argnums) result.push_back(i < 3 ? grads[i] : mx::zeros_like(primals[i], stream()));
    return result;
  }

  // vmap folds the mapped axis into the batch: (V, B, H, T, D) -> (V * B, H, T, D), and back.
  Mapped vmap(const std::vector<mx::array>& in, const std::vector<int>& axes) override {
    auto s = stream();
    int V = 1;
    for (size_t i = 0; i < in.size(); i++)
      if (axes[i] >= 0) V = in[i].shape(axes[i]);
    auto lead = [&](const mx::array& a, int axis) {  // the mapped axis first, V long
      auto m = axis >= 0 ? mx::moveaxis(a, axis, 0, s) : mx::expand_dims(a, 0, s);
      auto shape = m.shape();
      shape[0] = V;
      return mx::broadcast_to(m, shape, s);
    };
    std::vector<mx::array> folded;
    for (size_t i = 0; i < 3; i++) {
      auto a = lead(in[i], axes[i]);  // (V, B, H, T, D)
      folded.push_back(mx::reshape(a, {V * a.shape(1), a.shape(2), a.shape(3), a.shape(4)}, s));
    }
    int B = folded[0].shape(0) / V;
    if (in.size() > 3) {  // the uint8 key mask, (B or 1, Tk)
      auto m = lead(in[3], axes[3]);
      m = mx::broadcast_to(m, {V, B, m.shape(2)}, s);
      folded.push_back(mx::contiguous(mx::reshape(m, {V * B, m.shape(2)}, s), false, s));
    }
    std::vector<mx::array> outs;
    for (auto& o : attention_outputs(std::move(folded), causal_)) {
      auto shape = o.shape();
      shape[0] = B;
      shape.insert(shape.begin(), V);
      outs.push_back(mx::reshape(o, shape, s));
    }
    return {outs, {0, 0}};
  }

  // Forward mode, with MLX ops on the (Tq, Tk) probabilities P recomputed from the kernel's
  // log-normaliser (rare enough to not need a kernel): dS = tq k^T + q tk^T,
  // d_out = (P * (dS - rowsum(P dS))) v + P tv, d_lse = rowsum(P dS). The mask has none.
  std::vector<mx::array> jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override {
    auto s = stream();
    const auto &q = primals[0], &k = primals[1], &v = primals[2];
    auto fwd = attention_outputs(primals, causal_);
    int Tq = q.shape(2), Tk = k.shape(2);
    auto scores = mx::matmul(q, mx::swapaxes(k, -1, -2, s), s);  // (B, H, Tq, Tk)
    auto allowed = mx::array(true);  // broadcast against the masks below
    if (primals.size() > 3)  // (B or 1, Tk) -> (B or 1, 1, 1, Tk)
      allowed = mx::logical_and(
          allowed, mx::astype(mx::reshape(primals[3], {primals[3].shape(0), 1, 1, Tk}, s), mx::bool_, s), s);
    if (causal_) {  // query i sees keys j <= i + Tk - Tq
      auto i = mx::reshape(mx::arange(Tk - Tq, Tk, s), {Tq, 1}, s);
      allowed = mx::logical_and(allowed, mx::less_equal(mx::reshape(mx::arange(Tk, s), {1, Tk}, s), i, s), s);
    }
    auto p = mx::where(allowed, mx::exp(mx::subtract(scores, fwd[1], s), s), mx::array(0.f), s);
    std::optional<mx::array> d_scores, d_out;
    auto add = [&](std::optional<mx::array>& sum, const mx::array& term) { sum = sum ? mx::add(*sum, term, s) : term; };
    for (size_t i = 0; i < argnums.size(); i++) {
      const auto& t = tangents[i];
      if (argnums[i] == 0) add(d_scores, mx::matmul(t, mx::swapaxes(k, -1, -2, s), s));
      if (argnums[i] == 1) add(d_scores, mx::matmul(q, mx::swapaxes(t, -1, -2, s), s));
      if (argnums[i] == 2) add(d_out, mx::matmul(p, t, s));
    }
    auto d_lse = mx::zeros_like(fwd[1], s);
    if (d_scores) {
      d_lse = mx::sum(mx::multiply(p, *d_scores, s), -1, true, s);
      add(d_out, mx::matmul(mx::multiply(p, mx::subtract(*d_scores, d_lse, s), s), v, s));
    }
    return {d_out ? *d_out : mx::zeros_like(fwd[0], s), d_lse};
  }

  const char* name() const override { return "B2BAttention"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override {
    auto lse = in[0].shape();
    lse.back() = 1;
    return {in[0].shape(), lse};
  }
};

// GELU (../cpu_gelu.c), elementwise over row-contiguous inputs (the wrapper makes them so).
class GeluBackward : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  // inputs: x, dy; output: dx.
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    const float *x = in[0].data<float>(), *dy = in[1].data<float>();
    float* dx = outs[0].data<float>();
    long n = (long)in[0].size();
    enc.dispatch([=]() { b2b_gelu_backward(x, dy, n, dx); });
  }
  const char* name() const override { return "B2BGeluBackward"; }
};

class GeluForward : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    const float* x = in[0].data<float>();
    float* y = outs[0].data<float>();
    long n = (long)in[0].size();
    enc.dispatch([=]() { b2b_gelu_forward(x, n, y); });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>&, const std::vector<mx::array>&) override {
    auto dy = mx::contiguous(cotangents[0], false, stream());
    return {mx::array(primals[0].shape(), mx::float32, std::make_shared<GeluBackward>(stream(), 0.f),
                      {primals[0], dy})};
  }

  Mapped vmap(const std::vector<mx::array>& in, const std::vector<int>& axes) override {
    return {{gelu(in[0])}, {axes[0]}};  // elementwise: the mapped axis stays where it is
  }

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                             const std::vector<int>&) override {
    // GELU'(x) t is the backward kernel with t as the cotangent.
    auto t = mx::contiguous(tangents[0], false, stream());
    return {mx::array(primals[0].shape(), mx::float32, std::make_shared<GeluBackward>(stream(), 0.f), {primals[0], t})};
  }

  const char* name() const override { return "B2BGelu"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }
};

// Dropout (../cpu_dropout.c): inputs x (row-contiguous), seed (2,) uint32; the setting is the
// keep probability. Its gradient is the same primitive applied to the cotangent with the same
// seed (the same mask and scale), so no mask is stored.
class Dropout : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    const float* x = in[0].data<float>();
    const uint32_t* seed = in[1].data<uint32_t>();
    float* y = outs[0].data<float>();
    long n = (long)in[0].size();
    double kept = std::ldexp((double)setting_, 32);  // threshold: keep probability * 2^32, in [1, 2^32 - 1]
    uint32_t threshold = (uint32_t)std::min(std::max(std::round(kept), 1.0), 4294967295.0);
    float scale = (float)(4294967296.0 / threshold);
    enc.dispatch([=]() { b2b_dropout(x, n, seed, threshold, scale, y); });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>&) override {
    std::vector<mx::array> result;
    for (int i : argnums)
      result.push_back(i == 0 ? mx::array(primals[0].shape(), mx::float32, std::make_shared<Dropout>(stream(), setting_),
                                          {mx::contiguous(cotangents[0], false, stream()), primals[1]})
                              : mx::zeros_like(primals[1], stream()));
    return result;
  }

  // Elementwise: mapped, each example gets its own mask (the hash runs over the whole array).
  Mapped vmap(const std::vector<mx::array>& in, const std::vector<int>& axes) override {
    if (axes[1] >= 0) throw std::invalid_argument("b2b dropout: vmap over the seed is not supported");
    return {{dropout(in[0], in[1], setting_)}, {axes[0]}};
  }

  // Linear in x: the tangent goes through the same mask and scale; the seed has none.
  std::vector<mx::array> jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override {
    for (size_t i = 0; i < argnums.size(); i++)
      if (argnums[i] == 0)
        return {mx::array(primals[0].shape(), mx::float32, std::make_shared<Dropout>(stream(), setting_),
                          {mx::contiguous(tangents[i], false, stream()), primals[1]})};
    return {mx::zeros_like(primals[0], stream())};
  }

  const char* name() const override { return "B2BDropout"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }
};

// LayerNorm over the last axis (../cpu_layernorm.c). Both primitives read row-contiguous
// inputs (the wrapper makes them so); their setting is eps.
class NormPrimitive : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

 protected:
  float eps() const { return setting_; }
};

class LayerNormBackward : public NormPrimitive {
 public:
  using NormPrimitive::NormPrimitive;

  // inputs: x, w, mean, rstd, dy; outputs: dx, dw, db.
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    const float *x = in[0].data<float>(), *w = in[1].data<float>(), *mean = in[2].data<float>(),
                *rstd = in[3].data<float>(), *dy = in[4].data<float>();
    float *dx = outs[0].data<float>(), *dw = outs[1].data<float>(), *db = outs[2].data<float>();
    int C = in[0].shape(-1);
    long rows = (long)(in[0].size() / C);
    enc.dispatch([=]() {
      if (b2b_layer_norm_backward(x, w, mean, rstd, dy, rows, C, dx, dw, db) != 0)
        throw std::runtime_error("b2b layer_norm backward: out of memory");
    });
  }
  const char* name() const override { return "B2BLayerNormBackward"; }
};

class LayerNormForward : public NormPrimitive {
 public:
  using NormPrimitive::NormPrimitive;

  // inputs: x, w, b; outputs: y (x's shape), mean and rstd (x's shape without the last axis).
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    const float *x = in[0].data<float>(), *w = in[1].data<float>(), *b = in[2].data<float>();
    float *y = outs[0].data<float>(), *mean = outs[1].data<float>(), *rstd = outs[2].data<float>();
    int C = in[0].shape(-1);
    long rows = (long)(in[0].size() / C);
    float eps = this->eps();
    enc.dispatch([=]() { b2b_layer_norm_forward(x, w, b, rows, C, eps, y, mean, rstd); });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override {
    // mean and rstd are internal (the Python function returns only y): their cotangents are
    // zero and ignored.
    auto dy = mx::contiguous(cotangents[0], false, stream());
    auto grads = mx::array::make_arrays({primals[0].shape(), primals[1].shape(), primals[2].shape()},
                                        {mx::float32, mx::float32, mx::float32},
                                        std::make_shared<LayerNormBackward>(stream(), eps()),
                                        {primals[0], primals[1], outputs[1], outputs[2], dy});
    std::vector<mx::array> result;
    for (int i : argnums) result.push_back(grads[i]);
    return result;
  }

  // vmap: the kernel normalizes the last axis, so a mapped last axis moves to the front. A mapped
  // weight or bias (an ensemble of norms) is computed with MLX's ops instead.
  Mapped vmap(const std::vector<mx::array>& in, const std::vector<int>& axes) override {
    auto s = stream();
    auto x = in[0];
    int ax = axes[0];
    if (axes[1] < 0 && axes[2] < 0) {
      if (ax == x.ndim() - 1) x = mx::moveaxis(x, ax, 0, s), ax = 0;
      return {layer_norm_outputs(x, in[1], in[2], eps()), {ax, ax, ax}};
    }
    int V = axes[1] >= 0 ? in[1].shape(axes[1]) : in[2].shape(axes[2]);
    x = ax >= 0 ? mx::moveaxis(x, ax, 0, s) : mx::expand_dims(x, 0, s);
    auto shape = x.shape();
    shape[0] = V;
    x = mx::broadcast_to(x, shape, s);  // (V, ..., C)
    auto per_example = [&](const mx::array& p, int axis) {  // (V, 1, ..., 1, C), or (C,) when not mapped
      if (axis < 0) return p;
      mx::Shape one(x.ndim(), 1);
      one.front() = V, one.back() = x.shape(-1);
      return mx::reshape(mx::moveaxis(p, axis, 0, s), one, s);
    };
    auto mean = mx::mean(x, -1, false, s);
    auto rstd = mx::rsqrt(mx::add(mx::var(x, -1, false, 0, s), mx::array(eps()), s), s);
    auto y = mx::multiply(mx::subtract(x, mx::expand_dims(mean, -1, s), s), mx::expand_dims(rstd, -1, s), s);
    y = mx::add(mx::multiply(y, per_example(in[1], axes[1]), s), per_example(in[2], axes[2]), s);
    return {{y, mean, rstd}, {0, 0, 0}};
  }

  // Forward mode with MLX ops, x^ = (x - mean) rstd: d_x^ = rstd (tx - mean(tx) - x^ mean(x^ tx)),
  // d_y = d_x^ w + x^ tw + tb, d_mean = mean(tx), d_rstd = -rstd^2 mean(x^ tx).
  std::vector<mx::array> jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override {
    auto s = stream();
    auto fwd = layer_norm_outputs(primals[0], primals[1], primals[2], eps());
    auto mean = mx::expand_dims(fwd[1], -1, s), rstd = mx::expand_dims(fwd[2], -1, s);
    auto xhat = mx::multiply(mx::subtract(primals[0], mean, s), rstd, s);
    auto d_y = mx::zeros_like(fwd[0], s), d_mean = mx::zeros_like(fwd[1], s), d_rstd = mx::zeros_like(fwd[2], s);
    for (size_t i = 0; i < argnums.size(); i++) {
      const auto& t = tangents[i];
      if (argnums[i] == 0) {
        auto t_mean = mx::mean(t, -1, true, s), xt_mean = mx::mean(mx::multiply(xhat, t, s), -1, true, s);
        auto d_xhat = mx::multiply(rstd, mx::subtract(mx::subtract(t, t_mean, s), mx::multiply(xhat, xt_mean, s), s), s);
        d_y = mx::add(d_y, mx::multiply(d_xhat, primals[1], s), s);
        d_mean = mx::squeeze(t_mean, -1, s);
        d_rstd = mx::squeeze(mx::negative(mx::multiply(mx::square(rstd, s), xt_mean, s), s), -1, s);
      }
      if (argnums[i] == 1) d_y = mx::add(d_y, mx::multiply(xhat, t, s), s);
      if (argnums[i] == 2) d_y = mx::add(d_y, t, s);
    }
    return {d_y, d_mean, d_rstd};
  }

  const char* name() const override { return "B2BLayerNorm"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override {
    auto rows = in[0].shape();
    rows.pop_back();
    return {in[0].shape(), rows, rows};
  }
};

// The vocabulary projection and its cross-entropy (../cpu_vocab_loss.c); the setting is the
// label smoothing.
void vocab_loss_check(int code, const char* where) {
  if (code == -1) throw std::runtime_error(std::string("b2b vocab loss ") + where + ": out of memory");
  if (code == -2) throw std::runtime_error(std::string("b2b vocab loss ") + where + ": a label is outside the vocabulary");
  if (code != 0) throw std::runtime_error(std::string("b2b vocab loss ") + where + ": no sgemm was set");
}

class VocabLossBackward : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  // inputs: h, W, labels, weights, logits, lse, cotangent (N,); outputs: dh, dW, dbias.
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    const float *h = in[0].data<float>(), *W = in[1].data<float>(), *weights = in[3].data<float>(),
                *logits = in[4].data<float>(), *lse = in[5].data<float>(), *cot = in[6].data<float>();
    const int32_t* labels = in[2].data<int32_t>();
    float *dh = outs[0].data<float>(), *dW = outs[1].data<float>(), *db = outs[2].data<float>();
    long N = in[0].shape(0);
    int C = in[0].shape(1), V = in[1].shape(0);
    float smoothing = setting_;
    enc.dispatch([=]() {
      vocab_loss_check(
          b2b_vocab_loss_backward(h, W, labels, weights, logits, lse, cot, N, C, V, smoothing, dh, dW, db), "backward");
    });
  }
  const char* name() const override { return "B2BVocabLossBackward"; }
};

class VocabLossForward : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  // inputs: h (N, C), W (V, C), bias (V,), labels (N,) int32, weights (N,); outputs: loss (N,),
  // lse (N,), logits (N, V) (the last two for the backward only).
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    const float *h = in[0].data<float>(), *W = in[1].data<float>(), *bias = in[2].data<float>(),
                *weights = in[4].data<float>();
    const int32_t* labels = in[3].data<int32_t>();
    float *loss = outs[0].data<float>(), *lse = outs[1].data<float>(), *logits = outs[2].data<float>();
    long N = in[0].shape(0);
    int C = in[0].shape(1), V = in[1].shape(0);
    float smoothing = setting_;
    enc.dispatch([=]() {
      vocab_loss_check(b2b_vocab_loss_forward(h, W, bias, labels, weights, N, C, V, smoothing, loss, lse, logits),
                       "forward");
    });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override {
    // Only the loss is returned to Python: lse's and the logits' cotangents are zero, ignored.
    auto cot = mx::contiguous(mx::astype(cotangents[0], mx::float32, stream()), false, stream());
    auto grads = mx::array::make_arrays(
        {primals[0].shape(), primals[1].shape(), primals[2].shape()}, {mx::float32, mx::float32, mx::float32},
        std::make_shared<VocabLossBackward>(stream(), setting_),
        {primals[0], primals[1], primals[3], primals[4], outputs[2], outputs[1], cot});
    std::vector<mx::array> result;
    for (int i : argnums) result.push_back(i < 3 ? grads[i] : mx::zeros_like(primals[i], stream()));
    return result;
  }

  const char* name() const override { return "B2BVocabLoss"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override {
    return {{in[0].shape(0)}, {in[0].shape(0)}, {in[0].shape(0), in[1].shape(0)}};
  }
};

// One AdamW update (../cpu_adamw.c). inputs: p, g, m, v (one shape, contiguous), coef (4,);
// outputs: p, m, v updated, in the inputs' buffers where MLX lets them go (donation).
class AdamW : public mx::Primitive {
 public:
  AdamW(mx::Stream s, std::vector<float> hyper) : mx::Primitive(s), hyper_(std::move(hyper)) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    // Each of the three outputs holds its own copy of the inputs, which MLX drops right after
    // this call (detach); without dropping the other two copies now no input is ever
    // donatable, and every step would write ~3 x the model's size into fresh pages. Only when
    // `in` is exactly one output's own list (how MLX 0.32 calls this), and never on tracers.
    int own = 0;
    for (auto& o : outs) own += &o.inputs() == &in;
    if (own == 1 && !outs[0].is_tracer())
      for (auto& o : outs)
        if (&o.inputs() != &in) o.inputs().clear();
    for (int i = 0; i < 3; i++) {
      const auto& src = in[i == 0 ? 0 : i + 1];  // p -> p, m -> m, v -> v
      if (src.is_donatable() && src.flags().row_contiguous)
        outs[i].copy_shared_buffer(src);
      else
        outs[i].set_data(mx::allocator::malloc(outs[i].nbytes()));
    }
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.add_temporaries(in);  // the inputs outlive the task, whoever else drops them
    for (auto& a : in) enc.set_input_array(a);
    for (auto& o : outs) enc.set_output_array(o);
    const float *p = in[0].data<float>(), *g = in[1].data<float>(), *m = in[2].data<float>(), *v = in[3].data<float>(),
                *coef = in[4].data<float>();
    float *po = outs[0].data<float>(), *mo = outs[1].data<float>(), *vo = outs[2].data<float>();
    long n = (long)in[0].size();
    auto hyper = hyper_;
    enc.dispatch([=]() { b2b_adamw(p, g, m, v, n, coef, hyper.data(), po, mo, vo); });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("B2BAdamW runs on the CPU only");
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(*this) == typeid(other) && hyper_ == static_cast<const AdamW&>(other).hyper_;
  }
  const char* name() const override { return "B2BAdamW"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override {
    return {in[0].shape(), in[0].shape(), in[0].shape()};
  }

 private:
  std::vector<float> hyper_;  // b1, 1 - b1, b2, 1 - b2, eps
};

// The sum of squares of every input (float32, contiguous) as one float32 scalar.
class SumSquares : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& enc = prepare(*this, in, outs);
    std::vector<const float*> xs;
    std::vector<long> ns;
    for (const auto& a : in) xs.push_back(a.data<float>()), ns.push_back((long)a.size());
    float* out = outs[0].data<float>();
    enc.dispatch([=]() { *out = (float)b2b_sum_squares(xs.data(), ns.data(), (int)xs.size()); });
  }
  const char* name() const override { return "B2BSumSquares"; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>&) override { return {{}}; }
};

}  // namespace

std::vector<mx::array> attention_outputs(std::vector<mx::array> inputs, bool causal) {
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || q.dtype() != mx::float32 || k.dtype() != mx::float32 ||
      v.dtype() != mx::float32 || q.shape(3) % 16 != 0 || k.shape() != v.shape() || q.shape(3) != k.shape(3) ||
      q.shape(0) != k.shape(0) || q.shape(1) != k.shape(1))
    throw std::invalid_argument("b2b attention: float32 (B, H, T, D) q, k, v with D a multiple of 16");
  if (inputs.size() > 3) {
    const auto& m = inputs[3];
    if (m.ndim() != 2 || m.shape(1) != k.shape(2) || (m.shape(0) != 1 && m.shape(0) != k.shape(0)))
      throw std::invalid_argument("b2b attention: key_mask must be (B or 1, Tk)");
  }
  auto lse_shape = q.shape();
  lse_shape.back() = 1;
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array::make_arrays({q.shape(), lse_shape}, {mx::float32, mx::float32},
                                std::make_shared<AttentionForward>(s, causal), inputs);
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, std::optional<mx::array> key_mask,
                    bool causal) {
  auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {q, k, v};
  if (key_mask) inputs.push_back(mx::contiguous(mx::astype(*key_mask, mx::uint8, s), false, s));
  return attention_outputs(std::move(inputs), causal)[0];
}

std::vector<mx::array> layer_norm_outputs(const mx::array& x, const mx::array& w, const mx::array& b, float eps) {
  int C = x.ndim() ? x.shape(-1) : 0;
  if (x.ndim() < 1 || x.dtype() != mx::float32 || w.dtype() != mx::float32 || b.dtype() != mx::float32 ||
      w.shape() != mx::Shape{C} || b.shape() != mx::Shape{C} || C < 1)
    throw std::invalid_argument("b2b layer_norm: float32 x (..., C) with weight and bias (C,)");
  auto s = mx::default_stream(mx::Device::cpu);
  auto rows = x.shape();
  rows.pop_back();
  return mx::array::make_arrays(
      {x.shape(), rows, rows}, {mx::float32, mx::float32, mx::float32}, std::make_shared<LayerNormForward>(s, eps),
      {mx::contiguous(x, false, s), mx::contiguous(w, false, s), mx::contiguous(b, false, s)});
}

mx::array layer_norm(const mx::array& x, const mx::array& w, const mx::array& b, float eps) {
  return layer_norm_outputs(x, w, b, eps)[0];
}

mx::array gelu(const mx::array& x) {
  if (x.dtype() != mx::float32) throw std::invalid_argument("b2b gelu: float32 x");
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array(x.shape(), mx::float32, std::make_shared<GeluForward>(s, 0.f), {mx::contiguous(x, false, s)});
}

mx::array dropout(const mx::array& x, const mx::array& seed, float keep) {
  if (x.dtype() != mx::float32 || seed.dtype() != mx::uint32 || seed.size() != 2 || !(keep > 0.f && keep < 1.f))
    throw std::invalid_argument("b2b dropout: float32 x, a (2,) uint32 seed and a keep probability in (0, 1)");
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array(x.shape(), mx::float32, std::make_shared<Dropout>(s, keep),
                   {mx::contiguous(x, false, s), mx::contiguous(seed, false, s)});
}

mx::array vocab_loss(const mx::array& h, const mx::array& w, const mx::array& bias, const mx::array& labels,
                     const mx::array& weights, float smoothing) {
  if (h.ndim() != 2 || w.ndim() != 2 || h.dtype() != mx::float32 || w.dtype() != mx::float32 ||
      bias.dtype() != mx::float32 || h.shape(1) != w.shape(1) || bias.shape() != mx::Shape{w.shape(0)} ||
      labels.shape() != mx::Shape{h.shape(0)} || weights.shape() != mx::Shape{h.shape(0)})
    throw std::invalid_argument("b2b vocab_loss: float32 h (N, C), W (V, C), bias (V,), labels and weights (N,)");
  if (!b2b_has_sgemm()) throw std::runtime_error("b2b vocab_loss: no sgemm was set (set_sgemm)");
  auto s = mx::default_stream(mx::Device::cpu);
  auto c = [&](const mx::array& a, mx::Dtype t) { return mx::contiguous(mx::astype(a, t, s), false, s); };
  auto outs = mx::array::make_arrays(
      {{h.shape(0)}, {h.shape(0)}, {h.shape(0), w.shape(0)}}, {mx::float32, mx::float32, mx::float32},
      std::make_shared<VocabLossForward>(s, smoothing),
      {c(h, mx::float32), c(w, mx::float32), c(bias, mx::float32), c(labels, mx::int32), c(weights, mx::float32)});
  return outs[0];
}

std::vector<mx::array> adamw(const mx::array& p, const mx::array& g, const mx::array& m, const mx::array& v,
                             const mx::array& coef, std::vector<float> hyper) {
  for (const auto* a : {&p, &g, &m, &v})
    if (a->dtype() != mx::float32 || a->shape() != p.shape())
      throw std::invalid_argument("b2b adamw: float32 parameter, gradient, m and v of one shape");
  if (coef.dtype() != mx::float32 || coef.size() != 4 || hyper.size() != 5)
    throw std::invalid_argument("b2b adamw: coef (4,) float32 and 5 hyperparameters");
  auto s = mx::default_stream(mx::Device::cpu);
  auto c = [&](const mx::array& a) { return mx::contiguous(a, false, s); };
  return mx::array::make_arrays({p.shape(), p.shape(), p.shape()}, {mx::float32, mx::float32, mx::float32},
                                std::make_shared<AdamW>(s, std::move(hyper)), {c(p), c(g), c(m), c(v), c(coef)});
}

mx::array sum_squares(const std::vector<mx::array>& arrays) {
  if (arrays.empty()) throw std::invalid_argument("b2b sum_squares: no arrays");
  auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs;
  for (const auto& a : arrays) {
    if (a.dtype() != mx::float32) throw std::invalid_argument("b2b sum_squares: float32 arrays");
    inputs.push_back(mx::contiguous(a, false, s));
  }
  return mx::array(mx::Shape{}, mx::float32, std::make_shared<SumSquares>(s, 0.f), inputs);
}

NB_MODULE(_b2b_ops, m) {
  m.doc() = "b2b's C kernels for MLX's CPU backend, as MLX primitives";
  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("key_mask").none(),
        nb::arg("causal"));
  m.def("gelu", &gelu, nb::arg("x"), "GELU, x Phi(x), erf by a rational approximation; differentiable");
  m.def("dropout", &dropout, nb::arg("x"), nb::arg("seed"), nb::arg("keep"),
        "x with each element kept with probability keep (a hash of seed and its index) and scaled; differentiable");
  m.def("layer_norm", &layer_norm, nb::arg("x"), nb::arg("weight"), nb::arg("bias"), nb::arg("eps"));
  m.def("vocab_loss", &vocab_loss, nb::arg("h"), nb::arg("weight"), nb::arg("bias"), nb::arg("labels"),
        nb::arg("weights"), nb::arg("label_smoothing"));
  m.def("adamw", &adamw, nb::arg("p"), nb::arg("g"), nb::arg("m"), nb::arg("v"), nb::arg("coef"), nb::arg("hyper"),
        "one AdamW update: (p, m, v) new");
  m.def("sum_squares", &sum_squares, nb::arg("arrays"), "the sum of squares of every element, float32 scalar");
  m.def("set_sgemm", [](uintptr_t fn) { b2b_set_sgemm(reinterpret_cast<void*>(fn)); }, nb::arg("address"),
        "the address of cblas_sgemm, for vocab_loss");
  m.def("set_threads", &b2b_set_threads, nb::arg("n"), "threads per attention call at most (0: one per core, up to 8)");
}
