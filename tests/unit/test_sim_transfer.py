"""KV transfer model: bytes, devices, and a link shared by concurrent transfers."""

from __future__ import annotations

import pytest

from servesweep.sim.transfer import (
    TransferLink,
    TransferModel,
    dtype_factor,
    ib_device_count,
    link_bandwidth,
    plan_transfer,
    transfer_bytes,
)


def test_single_flow_takes_bytes_over_bandwidth() -> None:
    link = TransferLink(bandwidth=100.0)
    assert link.next_completion() is None and not link.busy
    assert link.add(key="a", nbytes=500.0, now=1.0) == []
    assert link.next_completion() == pytest.approx(6.0)
    assert link.advance(5.9) == []
    assert link.advance(6.0) == ["a"]
    assert not link.busy


def test_concurrent_flows_share_the_bandwidth() -> None:
    link = TransferLink(bandwidth=100.0)
    link.add(key="a", nbytes=400.0, now=0.0)
    link.add(key="b", nbytes=400.0, now=0.0)
    assert link.next_completion() == pytest.approx(8.0)
    link.add(key="c", nbytes=100.0, now=2.0)  # a, b have 300 left each
    # three flows at 33.3 B/s: c ends at 5, then a and b at 50 B/s with 200 left: 9
    assert link.next_completion() == pytest.approx(5.0)
    assert link.advance(5.0) == ["c"]
    assert link.advance(100.0) == ["a", "b"]
    assert link.now == 100.0


def test_max_parallel_queues_the_rest_in_order() -> None:
    link = TransferLink(bandwidth=10.0, max_parallel=1)
    for key in ("a", "b", "c"):
        link.add(key=key, nbytes=10.0, now=0.0)
    assert [link.advance(t) for t in (1.0, 2.0, 3.0)] == [["a"], ["b"], ["c"]]


def test_empty_flows_finish_at_once_and_many_tiny_flows_end() -> None:
    link = TransferLink(bandwidth=3.0)
    assert link.add(key="z", nbytes=0.0, now=0.0) == ["z"]
    for i in range(7):
        link.add(key=i, nbytes=0.1 * (i + 1), now=0.0)
    assert sorted(link.advance(1e9)) == list(range(7))


def test_bytes_follow_replication_dtype_and_state() -> None:
    m = TransferModel(kv_replicated=True, state_bytes_per_request=1000.0)
    full = transfer_bytes(model=m, tokens=10, kv_bytes_per_token=100.0, decode_tp=8)
    assert full == 10 * 100 * 8 + 1000
    fp8 = transfer_bytes(
        model=m, tokens=10, kv_bytes_per_token=100.0, decode_tp=8, kv_cache_dtype="fp8_e4m3"
    )
    assert fp8 == 10 * 100 * 8 / 2 + 1000
    sharded = TransferModel(kv_replicated=False)
    assert transfer_bytes(model=sharded, tokens=10, kv_bytes_per_token=100.0, decode_tp=8) == 1000
    assert dtype_factor("fp4_e2m1") == 0.25 and dtype_factor(None) == 1.0


def test_plan_adds_fixed_latency_warm_up_and_fake_costs_nothing() -> None:
    m = TransferModel(base_latency_s=0.5, endpoint_setup_s=3.0)
    first = plan_transfer(model=m, tokens=1, kv_bytes_per_token=1.0, decode_tp=1,
                          first_to_peer=True)  # fmt: skip
    later = plan_transfer(model=m, tokens=1, kv_bytes_per_token=1.0, decode_tp=1)
    assert (first.setup_s, later.setup_s, later.base_latency_s) == (3.0, 0.0, 0.5)
    fake = plan_transfer(model=m, tokens=99, kv_bytes_per_token=1.0, decode_tp=1, backend="fake")
    assert (fake.nbytes, fake.base_latency_s, fake.setup_s) == (0.0, 0.0, 0.0)


def test_ib_devices_count_names_and_json_maps() -> None:
    assert ib_device_count(None) == 1
    assert ib_device_count("mlx5_0,mlx5_1,mlx5_2,mlx5_3") == 4
    assert ib_device_count('{"0": "mlx5_0", "1": "mlx5_0", "2": "mlx5_1"}') == 2
    m = TransferModel(gbps_per_device=2.0)
    assert link_bandwidth(model=m, ib_device="mlx5_0,mlx5_1") == 4e9
