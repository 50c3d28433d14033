"""``prefix_attention(backend="auto")`` and its per-device table (``auto.yaml``): a listed
backend is taken for its device, head dim and pass; any other device keeps the default order."""

import pytest
import torch
from test_prefix_attention import _inputs

import wc_kernels
from wc_kernels import _backend, reference
from wc_kernels.ops.prefix_attention import _FAST, IMPLEMENTED, auto


def test_the_committed_auto_table_parses():
    table = auto.load_table()
    assert all(isinstance(name, str) and rows for name, rows in table.items())


def test_auto_takes_the_backend_the_table_lists_for_the_device_and_pass(monkeypatch):
    calls = []
    real = _FAST["replicated"]
    monkeypatch.setitem(_FAST, "replicated", lambda *a: calls.append("replicated") or real(*a))
    monkeypatch.setattr(auto, "load_table", lambda: auto.parse_table(
        {"cpu": [{"head_dim": 8, "grad": True, "backend": "replicated"}]}))
    ins = _inputs((2, 2, 5, 3, 3, 8), torch.float32)
    want = reference.prefix_attention(*ins)
    torch.testing.assert_close(wc_kernels.prefix_attention(*ins), want)
    assert calls == ["replicated"]
    with torch.no_grad():  # the forward-only pass is not listed: the default order
        wc_kernels.prefix_attention(*ins)
    assert calls == ["replicated"]
    assert auto.listed_backend(torch.device("cpu"), 8, True) == ("replicated",)
    assert auto.listed_backend(torch.device("cpu"), 16, True) == ()


def test_auto_on_an_unknown_device_keeps_the_default_order(monkeypatch):
    """A table for other devices changes nothing here: the same backend as with no table."""
    monkeypatch.setattr(auto, "load_table", lambda: auto.parse_table(
        {"NVIDIA H100 80GB HBM3": [{"head_dim": 8, "grad": True, "backend": "replicated"}]}))
    assert auto.listed_backend(torch.device("cpu"), 8, True) == ()
    assert _backend.resolve("prefix_attention", "auto", torch.device("cpu"), IMPLEMENTED,
                            auto.listed_backend(torch.device("cpu"), 8, True)) == \
        _backend.resolve("prefix_attention", "auto", torch.device("cpu"), IMPLEMENTED)
    # a listed backend that cannot run on the device is passed over
    assert _backend.resolve("prefix_attention", "auto", torch.device("cpu"), IMPLEMENTED,
                            ("sdpa_flash",)) == \
        _backend.resolve("prefix_attention", "auto", torch.device("cpu"), IMPLEMENTED)


@pytest.mark.parametrize(("data", "match"), [
    ([], "a mapping"),
    ({"cpu": {"head_dim": 8}}, "'cpu' must be a device name holding a list"),
    ({"cpu": [{"head_dim": 8, "grad": True}]}, "exactly head_dim, grad and backend"),
    ({"cpu": [{"head_dim": 0, "grad": True, "backend": "split"}]}, "head_dim must be"),
    ({"cpu": [{"head_dim": 8, "grad": "yes", "backend": "split"}]}, "grad must be"),
    ({"cpu": [{"head_dim": 8, "grad": True, "backend": "auto"}]}, "backend must be"),
    ({"cpu": [{"head_dim": 8, "grad": True, "backend": "split"},
              {"head_dim": 8, "grad": True, "backend": "replicated"}]}, "twice"),
])
def test_a_malformed_auto_table_names_what_is_wrong(data, match):
    with pytest.raises(ValueError, match=match):
        auto.parse_table(data)


def test_auto_with_its_table_compiles_fullgraph(monkeypatch):
    """The table lookup is a trace-time constant: no graph break under ``torch.compile``."""
    monkeypatch.setattr(auto, "load_table", lambda: auto.parse_table(
        {"cpu": [{"head_dim": 8, "grad": True, "backend": "replicated"}]}))
    ins = _inputs((2, 2, 5, 3, 3, 8), torch.float32)
    compiled = torch.compile(lambda *a: wc_kernels.prefix_attention(*a), backend="aot_eager",
                             fullgraph=True)
    torch.testing.assert_close(compiled(*ins), reference.prefix_attention(*ins))
