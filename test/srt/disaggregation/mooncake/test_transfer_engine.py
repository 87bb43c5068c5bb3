"""MooncakeTransferEngine wrapper over real loopback TCP: init, session id, register, writes, errors."""

import pytest
import torch

from sglang.srt.disaggregation.mooncake.transfer_engine import MooncakeTransferEngine, resolve_ib_device


@pytest.fixture(scope="module")
def engines():
    with pytest.MonkeyPatch.context() as mp:
        # an in-process mooncake_tcp ServerArgs of an earlier test leaves MC_FORCE_TCP=1 behind
        mp.delenv("MC_FORCE_TCP", raising=False)
        return MooncakeTransferEngine("127.0.0.1", force_tcp=True), MooncakeTransferEngine("127.0.0.1")


def test_protocol_and_session_id(engines, monkeypatch):
    tcp, default = engines
    assert tcp.protocol == "tcp"
    assert default.protocol == "rdma"  # default; Mooncake falls back to TCP without RDMA devices
    host, port = default.get_session_id().rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == default.engine.get_rpc_port() and default.get_localhost() == "127.0.0.1"
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    assert MooncakeTransferEngine("127.0.0.1").protocol == "tcp"


def test_write_single_and_batch(engines):
    a, b = engines
    src = torch.randint(0, 255, (1 << 16,), dtype=torch.uint8)
    dst = torch.zeros(1 << 16, dtype=torch.uint8)
    a.register(src.data_ptr(), src.nbytes)
    b.register(dst.data_ptr(), dst.nbytes)
    try:
        assert a.transfer_sync(b.get_session_id(), src.data_ptr(), dst.data_ptr(), 4096) == 0
        assert torch.equal(dst[:4096], src[:4096])
        # three scattered blocks in one batch
        blocks = [(100, 9000, 50), (20000, 30000, 3000), (60000, 100, 5000)]
        ret = a.batch_transfer_sync(
            b.get_session_id(),
            [src.data_ptr() + s for s, _, _ in blocks],
            [dst.data_ptr() + d for _, d, _ in blocks],
            [n for _, _, n in blocks],
        )
        assert ret == 0
        for s, d, n in blocks:
            assert torch.equal(dst[d : d + n], src[s : s + n])
        # a write to memory the peer never registered fails (< 0) instead of corrupting it
        other = torch.zeros(4096, dtype=torch.uint8)
        assert a.transfer_sync(b.get_session_id(), src.data_ptr(), other.data_ptr(), 4096) < 0
        assert a.batch_transfer_sync(b.get_session_id(), [src.data_ptr()], [other.data_ptr()], [64]) < 0
        assert int(other.sum()) == 0
    finally:
        a.deregister(src.data_ptr())
        b.deregister(dst.data_ptr())


def test_init_deadline(monkeypatch):
    """Initialisation runs under SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT; past it -> upstream's error."""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT", "0")
    with pytest.raises(RuntimeError) as e:
        MooncakeTransferEngine("127.0.0.1", force_tcp=True)
    assert str(e.value) == "Mooncake Transfer Engine initialization failed."


def test_register_failure_message(engines):
    a, _ = engines
    buf = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(RuntimeError) as e:
        a.register(buf.data_ptr(), 0)  # Mooncake rejects zero-length regions
    assert str(e.value).startswith("Mooncake memory registration failed (ret=")


def test_resolve_ib_device_forms(tmp_path):
    assert resolve_ib_device(None, 0) == "" and resolve_ib_device("mlx5_0", 3) == "mlx5_0"
    assert resolve_ib_device("mlx5_0,mlx5_1", 0) == "mlx5_0,mlx5_1"
    assert resolve_ib_device('{"0": "mlx5_0", "1": ["mlx5_1", "mlx5_2"]}', 1) == "mlx5_1,mlx5_2"
    f = tmp_path / "ib.json"
    f.write_text('{"0": "mlx5_9"}')
    assert resolve_ib_device(str(f), 0) == "mlx5_9"
    with pytest.raises(ValueError, match="No InfiniBand device configured for GPU 2"):
        resolve_ib_device(str(f), 2)
