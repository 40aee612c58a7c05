"""torch/buckets.py: which parameters DistributedOptimizer reduces together (pure planning)."""
import pytest

torch = pytest.importorskip("torch")

from trainrun.torch import buckets  # noqa: E402


def param(n, dtype=torch.float32, device="cpu", requires_grad=True):
    return torch.nn.Parameter(torch.empty(n, dtype=dtype, device=device), requires_grad=requires_grad)


def test_one_bucket_in_backward_order():
    ps = [param(4) for _ in range(5)]
    assert buckets.plan(ps, 1 << 20) == [tuple(reversed(ps))]


def test_cap_closes_a_bucket_once_reached_and_a_big_parameter_is_alone():
    a, b, c, big, d = param(10), param(10), param(10), param(1000), param(10)  # 40-byte params, one of 4000
    assert buckets.plan([a, b, c, big, d], 80) == [(d, big), (c, b), (a,)]
    assert buckets.plan([big], 80) == [(big,)]


def test_one_dtype_per_bucket_and_only_cpu_dense_trainable_parameters():
    f32, f64, frozen, meta = param(4), param(4, torch.float64), param(4, requires_grad=False), param(4, device="meta")
    f32b = param(4)
    got = buckets.plan([f32, f64, frozen, meta, f32b], 1 << 20)
    assert sorted(got, key=len) == [(f64,), (f32b, f32)]


def test_cap_zero_means_no_buckets():
    assert buckets.plan([param(4)], 0) == []


def test_first_bucket_closes_at_its_own_cap_and_never_above_the_cap():
    a, b, c, d, e = (param(10) for _ in range(5))  # 40 bytes each; backward order e, d, c, b, a
    assert buckets.plan([a, b, c, d, e], 120, first=40) == [(e,), (d, c, b), (a,)]
    assert buckets.plan([a, b, c, d, e], 80, first=1000) == buckets.plan([a, b, c, d, e], 80)
    assert buckets.plan([a, b, c, d, e], 1000, first=0) == [(e, d, c, b, a)]


def test_first_bucket_is_per_dtype():
    f32a, f64a, f32b, f64b = param(10), param(5, torch.float64), param(10), param(5, torch.float64)
    got = buckets.plan([f32a, f64a, f32b, f64b], 1000, first=40)
    assert sorted(got, key=lambda g: (g[0].dtype is torch.float64, len(g))) == [(f32b,), (f32a,), (f64b,), (f64a,)]
