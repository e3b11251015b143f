"""attn.sdpa on NumPy arrays: results against the float64 oracle under the team's rule, every
option, the kinds and dtypes that come back, strided inputs read in place, the GIL released,
and bad input refused with a Python exception."""

import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import assert_oracle, naive

import attn

CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "causal-bottom-right": dict(is_causal=True, align="bottom-right"),
    "window": dict(window=(3, 1)),
    "softcap": dict(softcap=5.0, scale=0.9),
    "key-lengths": dict(key_lengths=[7, 12]),
    "bool-mask": dict(mask="bool"),
    "float-mask": dict(mask="float"),
}


def inputs(rng, b=2, hq=4, hkv=2, lq=9, lk=12, d=16, dtype=np.float32):
    q = rng.standard_normal((b, hq, lq, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, lk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, lk, d)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_the_oracle(rng, case):
    opts = dict(CASES[case])
    q, k, v = inputs(rng)
    mask = opts.pop("mask", None)
    keep = bias = None
    if mask == "bool":
        keep = rng.random((2, 1, 9, 12)) > 0.3
        opts["attn_mask"] = keep
    elif mask == "float":
        bias = rng.standard_normal((9, 12)).astype(np.float32)
        opts["attn_mask"] = bias
    out = attn.sdpa(q, k, v, enable_gqa=True, **opts)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (2, 4, 9, 16)
    ref_opts = {key: opts[key] for key in ("scale", "window", "softcap", "align", "key_lengths") if key in opts}
    ref_opts["causal"] = opts.get("is_causal", False)
    ref64 = naive(q, k, v, keep=keep, bias=bias, **ref_opts)
    naive32 = naive(q, k, v, keep=keep, bias=bias, dtype=np.float32, **ref_opts)
    assert_oracle(out, naive32, ref64)


def test_float64_is_the_exact_reference(rng):
    q, k, v = inputs(rng, dtype=np.float64)
    out = attn.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, naive(q, k, v, causal=True), rtol=0, atol=1e-13)


def test_float16_comes_back_as_float16(rng):
    q, k, v = inputs(rng, dtype=np.float16)
    out = attn.sdpa(q, k, v, enable_gqa=True)
    assert out.dtype == np.float16
    ref = naive(q, k, v)
    assert np.abs(out.astype(np.float64) - ref).max() < 2e-3


def test_three_dimensional_inputs_are_one_head(rng):
    q, k, v = inputs(rng, b=2, hq=1, hkv=1)
    keep = rng.random((2, 9, 12)) > 0.2
    out, lse, w = attn.sdpa(q[:, 0], k[:, 0], v[:, 0], attn_mask=keep, return_lse=True, return_weights=True)
    assert out.shape == (2, 9, 16) and lse.shape == (2, 9) and w.shape == (2, 9, 12)
    full = attn.sdpa(q, k, v, attn_mask=keep[:, None])
    np.testing.assert_array_equal(out, full[:, 0])
    np.testing.assert_allclose(w.sum(-1), 1, atol=1e-5)


def test_lse_and_weights(rng):
    q, k, v = inputs(rng)
    out, lse, w = attn.sdpa(q, k, v, enable_gqa=True, return_lse=True, return_weights=True)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), np.repeat(k, 2, axis=1).astype(np.float64)) / 4
    ref_lse = np.log(np.exp(s).sum(-1))
    assert np.abs(lse - ref_lse).max() < 1e-5
    np.testing.assert_allclose(w @ np.repeat(v, 2, axis=1), out, atol=1e-5)


def test_strided_inputs_are_read_in_place(rng):
    # [B, L, H, D] transposed to [B, H, L, D], as attention layers produce them.
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (rng.standard_normal((2, 9, 4, 16)).astype(np.float32) for _ in range(3)))
    assert not q.flags.c_contiguous
    out = attn.sdpa(q, k, v)
    np.testing.assert_allclose(out, attn.sdpa(*(np.ascontiguousarray(x) for x in (q, k, v))), rtol=0, atol=0)


def test_read_only_and_broadcast_inputs_are_read_in_place(rng):
    # np.broadcast_to gives a read-only view with a stride-0 batch: DLPack 1.0 capsules carry it.
    q, k, v = inputs(rng, b=1)
    kb, vb = (np.broadcast_to(x, (3,) + x.shape[1:]) for x in (k, v))
    qb = np.ascontiguousarray(np.broadcast_to(q, (3,) + q.shape[1:]))
    qb.flags.writeable = False
    assert not kb.flags.writeable and kb.strides[0] == 0
    out = attn.sdpa(qb, kb, vb, enable_gqa=True)
    np.testing.assert_array_equal(out, attn.sdpa(*(np.ascontiguousarray(x) for x in (qb, kb, vb)), enable_gqa=True))


def test_native_module_takes_only_live_cpu_capsules(rng):
    torch = pytest.importorskip("torch")
    q, k, v = inputs(rng, hq=2)
    opts = dict(keep=None, bias=None, causal=False, window=None, bottom_right=False, key_lengths=None, scale=None,
                softcap=None, dropout_p=0.0, seed=0, bf16_products=False, sinks=None)
    with pytest.raises(TypeError, match="q: expected a DLPack capsule, found ndarray"):
        attn._attn.forward(q, k.__dlpack__(), v.__dlpack__(), opts, False)
    used = q.__dlpack__()
    torch.from_dlpack(used)  # consumes it
    with pytest.raises(ValueError, match="q: not an unconsumed DLPack capsule"):
        attn._attn.forward(used, k.__dlpack__(), v.__dlpack__(), opts, False)
    with pytest.raises(TypeError, match="k: DLPack type code 0 with 32 bits"):
        attn._attn.forward(q.__dlpack__(), k.astype(np.int32).__dlpack__(), v.__dlpack__(), opts, False)


def test_thread_count_is_settable():
    before = attn.get_num_threads()
    try:
        attn.set_num_threads(1)
        assert attn.get_num_threads() == 1
        with pytest.raises(ValueError, match="at least 1"):
            attn.set_num_threads(0)
    finally:
        attn.set_num_threads(before)
    assert attn.get_num_threads() == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_gets_threads_of_its_own(rng):
    # A fork data-loader worker inherits attn's started pool but not its threads; without a pool
    # of its own the child's call would wait for ever.
    q, k, v = inputs(rng, hq=2, hkv=2)
    expected = attn.sdpa(q, k, v)
    before = attn.get_num_threads()
    attn.set_num_threads(1)
    try:
        pid = os.fork()
        if pid == 0:
            ok = attn.get_num_threads() == 1 and np.array_equal(attn.sdpa(q, k, v), expected)
            os._exit(0 if ok else 1)
        for _ in range(400):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's attn.sdpa did not return within 20 s")
    finally:
        attn.set_num_threads(before)
    assert os.waitstatus_to_exitcode(status) == 0


def test_dropout_is_a_function_of_the_seed(rng):
    q, k, v = inputs(rng)
    a = attn.sdpa(q, k, v, dropout_p=0.3, enable_gqa=True, seed=5)
    b = attn.sdpa(q, k, v, dropout_p=0.3, enable_gqa=True, seed=5)
    c = attn.sdpa(q, k, v, dropout_p=0.3, enable_gqa=True, seed=6)
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3


def test_the_gil_is_released_while_the_kernel_runs(rng):
    q, k, v = inputs(rng, b=1, hq=8, hkv=8, lq=2048, lk=2048, d=64)
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(time.perf_counter())

    t = threading.Thread(target=count)
    t.start()
    try:
        start = time.perf_counter()
        attn.sdpa(q, k, v)
        end = time.perf_counter()
    finally:
        done.set()
        t.join()
    inside = [x for x in ticks if start < x < end]
    # With the GIL held, the counting thread could only run in the moments before the call
    # enters the kernel (one switch interval, 5 ms), not through the call.
    assert end - start > 0.03, end - start
    assert inside and max(inside) - min(inside) > 0.5 * (end - start), (end - start, len(inside))


BAD = [
    ("k length", lambda q, k, v: attn.sdpa(q, k[:, :, :3], v), ValueError, "v: dimension length"),
    ("heads without gqa", lambda q, k, v: attn.sdpa(q, k[:, :2], v[:, :2]), ValueError, "enable_gqa"),
    ("heads not a multiple", lambda q, k, v: attn.sdpa(q, k[:, :3], v[:, :3], enable_gqa=True), ValueError, "heads"),
    ("rank 2", lambda q, k, v: attn.sdpa(q[0, 0], k[0, 0], v[0, 0]), ValueError, "rank"),
    ("int dtype", lambda q, k, v: attn.sdpa(q.astype(np.int32), k, v), TypeError, "float32"),
    ("mixed dtypes", lambda q, k, v: attn.sdpa(q, k.astype(np.float64), v), TypeError, "differ"),
    ("list input", lambda q, k, v: attn.sdpa(q.tolist(), k, v), TypeError, "numpy array"),
    ("strided last dim", lambda q, k, v: attn.sdpa(q[..., ::2], k[..., ::2], v), ValueError, "last dimension"),
    ("negative stride", lambda q, k, v: attn.sdpa(q[:, :, ::-1], k, v), ValueError, "negative stride"),
    ("mask shape", lambda q, k, v: attn.sdpa(q, k, v, attn_mask=np.ones((3, 12), bool)), ValueError, "mask: shape"),
    ("mask dtype", lambda q, k, v: attn.sdpa(q, k, v, attn_mask=np.ones((9, 12), np.int64)), TypeError, "attn_mask"),
    ("dropout", lambda q, k, v: attn.sdpa(q, k, v, dropout_p=1.0), ValueError, "dropout"),
    ("scale", lambda q, k, v: attn.sdpa(q, k, v, scale=float("inf")), ValueError, "scale"),
    ("softcap", lambda q, k, v: attn.sdpa(q, k, v, softcap=-1.0), ValueError, "softcap"),
    ("window", lambda q, k, v: attn.sdpa(q, k, v, window=(-1, 2)), ValueError, "window"),
    ("window type", lambda q, k, v: attn.sdpa(q, k, v, window=3), TypeError, "window"),
    ("align", lambda q, k, v: attn.sdpa(q, k, v, align="centre"), ValueError, "align"),
    ("key lengths", lambda q, k, v: attn.sdpa(q, k, v, key_lengths=[1, 99]), ValueError, "key_lengths"),
    ("key lengths count", lambda q, k, v: attn.sdpa(q, k, v, key_lengths=[1]), ValueError, "key_lengths"),
    ("negative key length", lambda q, k, v: attn.sdpa(q, k, v, key_lengths=[1, -1]), ValueError, "key_lengths"),
]


@pytest.mark.parametrize("name,call,error,text", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(rng, name, call, error, text):
    q, k, v = inputs(rng, hq=4, hkv=4)
    with pytest.raises(error, match=text):
        call(q, k, v)
