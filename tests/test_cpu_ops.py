"""b2b's fused CPU attention as MLX primitives (b2b/cpu_ops.py) against MLX's attention: outputs
and gradients for every mask it takes, eager and under mx.compile, the model with and without
it (inference and a training step's gradients), and the cases where it must step aside."""
import mlx.core as mx
import numpy as np
import pytest

from b2b import B2BConfig, Bert2Bert, cpu_ops, fastmath

needs_kernels = pytest.mark.skipif(not cpu_ops.enabled(),
                                   reason="b2b's CPU kernels not built here (needs cmake, nanobind, a C++ compiler)")


def _reference(q, k, v, mask):
    """fastmath's MLX attention (the path the C kernel replaces), scaled q."""
    Tq, Tk = q.shape[2], k.shape[2]
    if isinstance(mask, str):
        mask = mx.arange(Tk)[None, :] <= (mx.arange(Tq)[:, None] + Tk - Tq)
    elif mask is None:
        mask = mx.array(True)
    return fastmath._attention(q, k, v, mask)


def _rel(a, b):
    return float(mx.abs(a - b).max() / (mx.abs(b).max() + 1e-9))


def _inputs(B, H, Tq, Tk, D, seed=0):
    mx.random.seed(seed)
    q = mx.random.normal((B, H, Tq, D))
    k = mx.random.normal((B, Tk, H, D)).transpose(0, 2, 1, 3)  # strided, as split_heads makes it
    v = mx.random.normal((B, H, Tk, D))
    return q, k, v


def _padding(B, Tk, seed=0):
    lengths = np.random.default_rng(seed).integers(1, Tk + 1, size=B)
    lengths[0] = Tk
    return mx.array(np.arange(Tk)[None, :] < lengths[:, None])[:, None, None, :]


@needs_kernels
@pytest.mark.parametrize(
    "shape, mask",
    [
        ((2, 3, 37, 45, 32), "padding"),
        ((2, 3, 40, 40, 32), "causal"),
        ((2, 2, 33, 50, 16), "causal"),  # cached: query i sees keys up to i + 17
        ((1, 2, 5, 70, 64), None),
        ((3, 2, 16, 16, 16), "broadcast"),
        ((2, 2, 101, 90, 32), "padding"),  # several query blocks, the last one partial
        ((1, 2, 130, 130, 32), "causal"),
    ],
)
def test_matches_mlx_forward_and_gradients(shape, mask):
    B, H, Tq, Tk, D = shape
    q, k, v = _inputs(*shape)
    if mask == "padding":
        mask = _padding(B, Tk)
    elif mask == "broadcast":
        mask = mx.array(np.arange(Tk) < Tk - 3)[None, None, None, :]
    out = cpu_ops.attention(q, k, v, mask)
    assert _rel(out, _reference(q, k, v, mask)[0]) < 1e-5
    w = mx.random.normal(out.shape)

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v, mask) * w).sum()

    ref = mx.grad(loss(lambda *a: _reference(*a)[0]), argnums=(0, 1, 2))(q, k, v)
    grads = mx.grad(loss(cpu_ops.attention), argnums=(0, 1, 2))(q, k, v)
    compiled = mx.compile(mx.grad(loss(cpu_ops.attention), argnums=(0, 1, 2)))(q, k, v)
    for g, c, r in zip(grads, compiled, ref):
        assert _rel(g, r) < 2e-5 and _rel(c, r) < 2e-5


@needs_kernels
def test_padding_keys_get_no_weight():
    """Changing a padded key's value must not change any output (a kernel that ignored the
    mask would mix it in)."""
    q, k, v = _inputs(2, 2, 8, 24, 32)
    mask = mx.array(np.arange(24) < 10)[None, None, None, :]
    out = cpu_ops.attention(q, k, v, mask)
    v2 = mx.concatenate([v[:, :, :10], v[:, :, 10:] + 100.0], axis=2)
    assert mx.allclose(out, cpu_ops.attention(q, k, v2, mask)).item()
    assert not mx.allclose(out, cpu_ops.attention(q, k, v2, None)).item()


@needs_kernels
def test_steps_aside_where_it_does_not_apply():
    q, k, v = _inputs(1, 2, 4, 6, 32)
    assert cpu_ops.attention(q, k, v, mx.ones((4, 6), mx.bool_)) is None  # a full (Tq, Tk) mask
    qb, kb, vb = _inputs(2, 2, 4, 6, 32)
    assert cpu_ops.attention(qb, kb[:1], vb[:1], None) is None  # K/V broadcast over the batch
    q8, k8, v8 = _inputs(1, 2, 4, 6, 8)
    assert cpu_ops.attention(q8, k8, v8, None) is None  # head size not a multiple of 16
    assert cpu_ops.attention(q.astype(mx.float16), k.astype(mx.float16), v, None) is None


@needs_kernels
def test_environment_switch(monkeypatch):
    import b2b

    q, k, v = _inputs(1, 2, 4, 6, 32)
    assert b2b.runtime_info()["cpu_attention"] is True
    monkeypatch.setenv("B2B_CPU_ATTENTION", "0")
    assert not cpu_ops.enabled() and cpu_ops.attention(q, k, v, None) is None
    assert b2b.runtime_info()["cpu_attention"] is False


def _model():
    cfg = B2BConfig(vocab_size=120, hidden_size=64, num_heads=2, encoder_layers=2, decoder_layers=2, ffn_size=128,
                    max_positions=64)
    mx.random.seed(3)
    model = Bert2Bert(cfg)
    model.eval()
    return model

def _training_loss(model):
    """value_and_grad of a loss on a small fixed batch: what a training step computes."""
    import mlx.nn as nn

    src = mx.array(np.random.default_rng(0).integers(5, 120, size=(2, 24)))
    tgt = mx.array(np.random.default_rng(1).integers(5, 120, size=(2, 9)))
    mask = mx.ones(src.shape, dtype=mx.int32)
    return nn.value_and_grad(model, lambda m: m(src, mask, tgt).square().mean())


def _count_calls(monkeypatch, name):
    """cpu_ops.<name> wrapped to record each call; the list of calls."""
    calls, real = [], getattr(cpu_ops, name)
    monkeypatch.setattr(cpu_ops, name, lambda *a: calls.append(1) or real(*a))
    return calls



@needs_kernels
@pytest.mark.parametrize("training", [False, True])
def test_model_uses_it_and_matches(monkeypatch, training):
    """Every multi-query attention of the model goes through it, in inference and in a
    training step's gradient, and gives MLX's logits and gradients."""
    import mlx.nn as nn

    model = _model()
    src = mx.array(np.random.default_rng(0).integers(5, 120, size=(2, 40)))
    src_mask = mx.array((np.arange(40)[None, :] < np.array([[40], [23]])).astype(np.int32))
    tgt = mx.array(np.random.default_rng(1).integers(5, 120, size=(2, 12)))

    def loss(m):
        return m(src, src_mask, tgt).astype(mx.float32).square().mean()

    calls = []
    real = cpu_ops.attention
    monkeypatch.setattr(cpu_ops, "attention", lambda *a: calls.append(1) or real(*a))
    fn = nn.value_and_grad(model, loss) if training else loss
    fused = fn(model)
    assert len(calls) == 2 * 1 + 2 * 2  # encoder self-attention; decoder self- and cross-attention
    monkeypatch.setenv("B2B_CPU_ATTENTION", "0")
    plain = fn(model)
    if training:
        from mlx.utils import tree_flatten

        assert _rel(fused[0], plain[0]) < 1e-5
        for (name, g), (_, r) in zip(tree_flatten(fused[1]), tree_flatten(plain[1])):
            # key biases get ~0 gradient (softmax ignores a shift shared by a row): absolute floor
            assert float(mx.abs(g - r).max()) <= 1e-3 * float(mx.abs(r).max()) + 1e-8, name
    else:
        assert _rel(fused, plain) < 1e-5


def test_built_where_its_tools_are():
    """Where cmake, nanobind and a C++ compiler exist (setup.sh and CI install them) the
    extension must build and load: a broken build must fail here, not skip everything above."""
    import importlib.util
    import shutil

    if not (cpu_ops._cmake() and importlib.util.find_spec("nanobind") and (shutil.which("c++") or shutil.which("g++"))):
        pytest.skip("no cmake / nanobind / C++ compiler here")
    assert cpu_ops._module() is not None


@needs_kernels
def test_beam_search_on_the_mlx_decoding_path_is_unchanged(monkeypatch):
    """With the C decoding step off, beam search runs MLX's compiled step, where an input's beams
    are the queries of one attention (Tq = beams): the fused kernel serves it there."""
    from b2b import DecodingConfig, generate

    model = _model()
    src = mx.array(np.random.default_rng(0).integers(5, 120, size=(2, 30)))
    src_mask = mx.array((np.arange(30)[None, :] < np.array([[30], [17]])).astype(np.int32))
    cfg = DecodingConfig(max_length=12, num_beams=3, no_repeat_ngram_size=0)
    monkeypatch.setenv("B2B_CPU_STEP", "0")
    calls = []
    real = cpu_ops.attention
    monkeypatch.setattr(cpu_ops, "attention", lambda *a: calls.append(a[0].shape[2]) or real(*a))
    fused = [h.tokens for h in generate(model, src, src_mask, cfg)]
    assert 3 in calls  # beams as queries
    monkeypatch.setenv("B2B_CPU_ATTENTION", "0")
    assert [h.tokens for h in generate(model, src, src_mask, cfg)] == fused


@needs_kernels
def test_first_use_inside_mx_compile_enables_it():
    """A program whose first attention is inside mx.compile (a compiled training step) must get
    the kernel: loading the extension may not evaluate anything (fresh process: the load is
    cached per process)."""
    import os
    import subprocess
    import sys

    code = ("import b2b, mlx.core as mx\nfrom b2b import cpu_ops\nq = mx.random.normal((1, 2, 4, 32))\n"
            "out = mx.compile(lambda q: cpu_ops.attention(q, q, q, None))(q)\n"
            "print(out is not None and cpu_ops._module() is not None)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


# -- LayerNorm --------------------------------------------------------------------------------

@needs_kernels
@pytest.mark.parametrize("shape", [(3, 7, 48), (130, 384), (5,)])
def test_layer_norm_matches_mlx_forward_and_gradients(shape):
    mx.random.seed(1)
    x = mx.random.normal(shape) * 3 + 2
    w, b = mx.random.normal(shape[-1:]), mx.random.normal(shape[-1:])
    c = mx.random.normal(shape)

    def plain(x, w, b):
        return mx.fast.layer_norm(x, w, b, 1e-12)

    def fused(x, w, b):
        return cpu_ops.layer_norm(x, w, b, 1e-12)

    assert _rel(fused(x, w, b), plain(x, w, b)) < 1e-5
    for fn in (lambda f: f, mx.compile):
        grads = [fn(mx.grad(lambda x, w, b: (f(x, w, b) * c).sum(), argnums=(0, 1, 2)))(x, w, b) for f in (fused, plain)]
        for g, r in zip(*grads):
            assert _rel(g, r) < 1e-4


@needs_kernels
def test_layer_norm_reads_strided_inputs():
    mx.random.seed(2)
    x = mx.random.normal((6, 4, 32)).transpose(1, 0, 2)  # not row-contiguous
    w, b = mx.ones((32,)), mx.zeros((32,))
    assert _rel(cpu_ops.layer_norm(x, w, b, 1e-5), mx.fast.layer_norm(x, w, b, 1e-5)) < 1e-5


@needs_kernels
def test_layer_norm_steps_aside(monkeypatch):
    x, w, b = mx.ones((2, 8)), mx.ones((8,)), mx.zeros((8,))
    assert cpu_ops.layer_norm(x.astype(mx.float16), w.astype(mx.float16), b.astype(mx.float16), 1e-5) is None
    assert cpu_ops.layer_norm(x, mx.ones((4,)), b, 1e-5) is None
    import b2b

    assert b2b.runtime_info()["cpu_layernorm"] is True
    monkeypatch.setenv("B2B_CPU_LAYERNORM", "0")
    assert cpu_ops.layer_norm(x, w, b, 1e-5) is None and cpu_ops.enabled("attention")
    assert b2b.runtime_info()["cpu_layernorm"] is False


@needs_kernels
@pytest.mark.parametrize("kernel, switch, calls", [
    ("layer_norm", "B2B_CPU_LAYERNORM", 2 + 2 * 2 + 2 * 3 + 1),  # two embeddings; 2 per encoder layer, 3 per decoder layer; LM head
    ("gelu", "B2B_CPU_GELU", 2 + 2 + 1),  # one per encoder and decoder layer; the LM head's transform
])
def test_model_uses_the_kernel_everywhere_and_matches(monkeypatch, kernel, switch, calls):
    """Every LayerNorm (GELU) of the model goes through the kernel; the loss and a training
    step's gradients equal those without it."""
    from mlx.utils import tree_flatten

    model = _model()
    loss = _training_loss(model)
    seen = _count_calls(monkeypatch, kernel)
    fused = loss(model)
    assert len(seen) == calls
    monkeypatch.setenv(switch, "0")
    plain = loss(model)
    assert _rel(fused[0], plain[0]) < 1e-5
    for (name, g), (_, r) in zip(tree_flatten(fused[1]), tree_flatten(plain[1])):
        assert float(mx.abs(g - r).max()) <= 1e-3 * float(mx.abs(r).max()) + 1e-8, name


# -- GELU -------------------------------------------------------------------------------------

@needs_kernels
@pytest.mark.parametrize("shape", [(4, 50, 96), (7,), (3, 33)])  # whole vectors and tails
def test_gelu_matches_erf_gelu_forward_and_gradient(shape):
    mx.random.seed(3)
    x = mx.random.normal(shape) * 3  # reaches past the approximation's clip at |x / sqrt 2| = 4
    c = mx.random.normal(shape)

    def exact(x):
        return 0.5 * x * (1.0 + mx.erf(x * (1.0 / np.sqrt(2.0))))

    assert float(mx.abs(cpu_ops.gelu(x) - exact(x)).max()) < 5e-6 * float(mx.abs(x).max())
    for fn in (lambda f: f, mx.compile):
        got, want = (fn(mx.grad(lambda x: (f(x) * c).sum()))(x) for f in (cpu_ops.gelu, exact))
        assert _rel(got, want) < 1e-5


@needs_kernels
def test_gelu_reads_strided_inputs_and_steps_aside(monkeypatch):
    x = mx.random.normal((6, 4, 32)).transpose(1, 0, 2)  # not row-contiguous
    assert _rel(cpu_ops.gelu(x), fastmath._gelu_kernel(x)) < 1e-5
    assert cpu_ops.gelu(x.astype(mx.float16)) is None
    import b2b

    assert b2b.runtime_info()["cpu_gelu"] is True
    monkeypatch.setenv("B2B_CPU_GELU", "0")
    assert cpu_ops.gelu(x) is None and b2b.runtime_info()["cpu_gelu"] is False
    assert _rel(fastmath.gelu(x), fastmath._gelu_kernel(x)) < 1e-6  # the compiled MLX path then


# -- dropout ----------------------------------------------------------------------------------

@needs_kernels
def test_dropout_keeps_the_expected_share_scaled_and_repeats_with_the_seed():
    x = mx.random.normal((8, 64, 96)) + 3.0  # no zeros of its own
    mx.random.seed(11)
    y = cpu_ops.dropout(x, 0.1)
    kept = np.array(y != 0)
    assert abs(kept.mean() - 0.9) < 0.005  # 49k elements: ~5 standard deviations
    assert float(mx.abs(mx.where(y != 0, y / x, 1 / 0.9) - 1 / 0.9).max()) < 1e-5  # kept ones scaled by 1 / (1 - p)
    assert abs(np.corrcoef(kept.ravel()[:-1], kept.ravel()[1:])[0, 1]) < 0.02  # neighbours independent
    mx.random.seed(11)
    assert bool(mx.all(cpu_ops.dropout(x, 0.1) == y))  # the seed repeats the mask
    share = float(mx.mean((cpu_ops.dropout(x, 0.1) != 0) != (y != 0)))
    assert abs(share - 2 * 0.1 * 0.9) < 0.01  # the next draw is a fresh mask


@needs_kernels
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000])  # tails and whole vectors
def test_dropout_gradient_is_the_same_mask_and_scale(n):
    x, c = mx.random.normal((n,)) + 5.0, mx.random.normal((n,))
    for fn in (lambda f: f, mx.compile):
        mx.random.seed(n)
        y, grads = fn(lambda x, c: mx.vjp(lambda x: cpu_ops.dropout(x, 0.25), [x], [c]))(x, c)
        y, g = y[0], grads[0]
        assert bool(mx.all((g != 0) == (y != 0)))
        assert float(mx.abs(g - mx.where(y != 0, c / 0.75, 0.0)).max()) < 1e-5


@needs_kernels
def test_dropout_steps_aside_and_the_model_uses_it_in_training_only(monkeypatch):
    x = mx.ones((4, 8))
    assert cpu_ops.dropout(x.astype(mx.float16), 0.1) is None and cpu_ops.dropout(x, 0.0) is None
    model = _model()
    calls = _count_calls(monkeypatch, "dropout")
    src = mx.array(np.random.default_rng(0).integers(5, 120, size=(2, 24)))
    tgt = mx.array(np.random.default_rng(1).integers(5, 120, size=(2, 9)))
    mask = mx.ones(src.shape, dtype=mx.int32)
    mx.eval(model(src, mask, tgt))
    assert not calls  # eval mode: no dropout
    model.train()
    mx.eval(model(src, mask, tgt))
    assert len(calls) == 2 + 2 * 2 + 2 * 3  # two embeddings; 2 per encoder layer, 3 per decoder layer
    monkeypatch.setenv("B2B_CPU_DROPOUT", "0")
    assert cpu_ops.dropout(x, 0.1) is None
