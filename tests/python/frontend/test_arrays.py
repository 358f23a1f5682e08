"""meshtrain.Array from Python: NumPy round trips for every dtype, properties, operators,
indexing, and the engine's errors as mt.Error."""
import numpy as np
import pytest

import meshtrain as mt
from conftest import rand


@pytest.mark.parametrize("np_dtype,name", [(np.float32, "f32"), (np.float16, "f16"), (np.int32, "i32"),
                                           (np.int64, "i64"), (np.bool_, "bool")])
def test_numpy_round_trip_is_exact(np_dtype, name):
    a = (rand((3, 4, 5), 1) * 10).astype(np_dtype)
    x = mt.array(a)
    assert x.dtype == name and x.shape == (3, 4, 5) and x.ndim == 3 and x.size == 60 and x.device == "cpu"
    back = np.asarray(x)
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)


def test_bfloat16_rounds_and_comes_back_as_float32_or_raw_bits():
    a = rand((4, 6), 2)
    x = mt.array(a, dtype=mt.bfloat16)
    assert x.dtype == "bf16"
    f = x.numpy()
    assert f.dtype == np.float32
    # bf16 keeps the top 16 bits of an f32 (rounded to nearest even).
    bits = x.numpy(raw=True)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal((bits.astype(np.uint32) << 16).view(np.float32), f)
    assert np.max(np.abs(f - a) / np.maximum(np.abs(a), 1e-3)) <= 2 ** -8


def test_lists_scalars_and_float64_become_engine_dtypes():
    assert mt.array([[1.0, 2.0]]).dtype == "f32"  # float64 -> f32
    assert mt.array([1, 2, 3]).dtype == "i64"
    x = mt.array(3.5)
    assert x.shape == () and x.item() == 3.5 and float(x) == 3.5
    assert mt.array([7]).item() == 7 and isinstance(mt.array([7]).item(), int)
    assert mt.array([2**60 + 1]).item() == 2**60 + 1  # integers read exactly, not through a double


def test_operators_match_numpy():
    a, b = rand((3, 4), 3), rand((3, 4), 4, 0.5, 2.0)
    x, y = mt.array(a), mt.array(b)
    cases = {
        "x + y": (x + y, a + b), "x - y": (x - y, a - b), "x * y": (x * y, a * b), "x / y": (x / y, a / b),
        "x + 2": (x + 2, a + 2), "2 - x": (2 - x, 2 - a), "3 * x": (3 * x, 3 * a), "1 / y": (1 / y, 1 / b),
        "y ** 2": (y ** 2, b ** 2), "-x": (-x, -a), "x @ y.T": (x @ y.T, a @ b.T),
    }
    for what, (got, want) in cases.items():
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6, err_msg=what)
    np.testing.assert_array_equal(np.asarray(x < y), a < b)
    np.testing.assert_array_equal(np.asarray(x >= 0), a >= 0)


def test_indexing_matches_numpy():
    a = rand((4, 5, 6), 5)
    x = mt.array(a)
    for key in [1, -1, (slice(None), slice(1, 3)), (Ellipsis, -1), (slice(None, None, 2),), (None, 2),
                (slice(1, None), Ellipsis, slice(0, 4)), (0, 1, 2)]:
        np.testing.assert_array_equal(np.asarray(x[key]), a[key], err_msg=str(key))
    np.testing.assert_array_equal(np.asarray(x[[3, 0, 3]]), a[[3, 0, 3]])
    np.testing.assert_array_equal(np.asarray(x[:, mt.array([4, 1])]), a[:, [4, 1]])


def test_engine_errors_arrive_as_mt_error_naming_op_and_shapes():
    x, y = mt.array(rand((2, 3), 6)), mt.array(rand((4, 5), 7))
    with pytest.raises(mt.Error) as info:
        mt.matmul(x, y)
    assert "matmul" in str(info.value) and "(2, 3)" in str(info.value) and "(4, 5)" in str(info.value)
    assert issubclass(mt.Error, ValueError)
    with pytest.raises(mt.Error, match="out of range"):
        x[5]
    with pytest.raises(mt.Error, match="unknown dtype"):
        mt.array([1.0], dtype="float64")


@pytest.mark.parametrize("dtype", [torch_dtype for torch_dtype in ("float32", "float16", "bfloat16", "int32", "int64")])
def test_dlpack_both_ways_shares_memory(dtype):
    import torch
    t = (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) - 5).to(getattr(torch, dtype))
    x = mt.from_dlpack(t)
    assert x.shape == (2, 3, 4) and x.data_ptr == t.data_ptr()
    np.testing.assert_array_equal(np.asarray(mt.cast(x, "f32")), t.float().numpy())
    t += 1  # the same memory: the engine array sees the change
    np.testing.assert_array_equal(np.asarray(mt.cast(x, "f32")), t.float().numpy())
    y = x * 2 if dtype != "int32" else x + x  # an engine result, exported back
    u = torch.from_dlpack(y)
    assert u.data_ptr() == y.data_ptr and u.dtype == t.dtype
    np.testing.assert_array_equal(u.float().numpy(), (t * 2).float().numpy())
    del y  # the torch tensor keeps the storage alive
    np.testing.assert_array_equal(u.float().numpy(), (t * 2).float().numpy())


def test_dlpack_refuses_what_it_cannot_share():
    import torch
    with pytest.raises(mt.Error, match="compact row-major"):
        mt.from_dlpack(torch.ones(3, 4).t())
    with pytest.raises(mt.Error, match="bool"):
        mt.array([True, False]).__dlpack__()


def test_indexing_refuses_what_numpy_would_do_differently_and_iterates():
    a = rand((4, 5), 8)
    x = mt.array(a)
    mask = np.array([True, False, True, False])
    np.testing.assert_array_equal(np.asarray(x[mask]), a[mask])  # a mask selects, NumPy's rule
    with pytest.raises(mt.Error, match="more than one integer-array index"):
        x[[0, 1], [1, 2]]
    rows = [np.asarray(r) for r in x]
    assert len(rows) == 4 and np.array_equal(rows[2], a[2])


def test_fractional_scalars_promote_integer_arrays():
    ids = mt.array([1, 2, 3])
    np.testing.assert_allclose(np.asarray(ids * 0.5), [0.5, 1.0, 1.5])
    np.testing.assert_array_equal(np.asarray(ids > 1.5), [False, True, True])
    assert (ids + 2).dtype == "i64"


def test_small_arrays_print_their_values_large_ones_their_shape():
    assert repr(mt.array([[1.5, 2.0]])) == "meshtrain.Array([[1.5, 2. ]], dtype=f32, device=cpu)"
    assert repr(mt.zeros((100, 100))) == "meshtrain.Array(f32(100, 100), device=cpu)"
