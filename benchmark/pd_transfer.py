"""PD KV transfer throughput: our Mooncake manager/sender/receiver vs the raw engine, same bytes, same run.

For each request size (tokens) it builds nothing new: one prefill and one decode `MHATokenToKVPool`
(default: the SmolLM2-135M KV layout, 30 layers x 3 KV heads x 64 dims, bf16 = 23,040 bytes/token),
one bootstrap server and two Mooncake KV managers in this process, talking over loopback TCP. Then:

* pd:  time from `sender.send(pages)` to `receiver.poll() == Success` (grouping into contiguous runs,
       one batch_transfer_sync_write of all layers' K/V + the metadata row, ZMQ done signal, polling).
* raw: the same bytes written with `TransferEngine.transfer_sync_write`, one call per layer buffer
       (contiguous source and destination; no grouping, no control messages).
* raw batch: those per-buffer blocks in one `batch_transfer_sync_write`.
* copy: those blocks by the same-host copy that replaces Mooncake's data path when the decode is a
       process on this machine (`same_host.py`, one `process_vm_writev`; here into this process's
       own decode pool, the same kernel path as into another process); the pd column keeps
       Mooncake (its decode manager runs with SGLANG_DISAGGREGATION_SAME_HOST_COPY=0).

Usage:
    python benchmark/pd_transfer.py                       # 1k, 4k, 16k, 64k tokens
    python benchmark/pd_transfer.py --sizes 1024,8192 --page-size 1 --layout random --repeats 5
Memory: about 2 x tokens x bytes/token for the largest size (64k SmolLM2 tokens: ~3 GiB).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from sglang.srt.configs.runtime_config import DisaggConfig
from sglang.srt.disaggregation.base import kv_args_from_pools
from sglang.srt.disaggregation.transfer_backends import get_kv_class
from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
from sglang.srt.disaggregation.mooncake import same_host
from sglang.srt.disaggregation.mooncake.blocks import contiguous_runs
from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType, KVPoll, MetadataBuffers
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.utils import get_free_port

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--sizes", default="1024,4096,16384,65536", help="comma-separated request sizes in tokens")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=30, help="attention layers (SmolLM2-135M: 30)")
    p.add_argument("--kv-heads", type=int, default=3, help="KV heads (SmolLM2-135M: 3)")
    p.add_argument("--head-dim", type=int, default=64, help="head dim (SmolLM2-135M: 64)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--layout", default="contiguous", choices=["contiguous", "random"], help="page placement on both sides")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per size (best and median are reported)")
    p.add_argument("--backend", default="mooncake_tcp", choices=["mooncake", "mooncake_tcp"])
    p.add_argument("--timeout", type=float, default=120.0, help="per-transfer timeout in seconds")
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def wait(obj, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        s = obj.poll()
        if s in (KVPoll.Success, KVPoll.Failed):
            return s
        if time.monotonic() > deadline:
            raise TimeoutError(f"transfer did not finish within {timeout}s (state {s})")
        time.sleep(0.0002)


def pages_for(rng, layout: str, n_pages: int, total_pages: int) -> np.ndarray:
    if layout == "contiguous":
        return np.arange(1, n_pages + 1, dtype=np.int32)
    return (rng.permutation(total_pages)[:n_pages] + 1).astype(np.int32)


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    ps = args.page_size
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    bytes_per_token = 2 * args.layers * args.kv_heads * args.head_dim * elem
    total_pages = -(-max(sizes) // ps)
    log(f"KV layout: {args.layers} layers x {args.kv_heads} heads x {args.head_dim} dims {args.dtype} = {bytes_per_token} B/token; "
        f"pools of {total_pages * ps} tokens ({2 * total_pages * ps * bytes_per_token / 2**30:.2f} GiB for both sides)")

    port = get_free_port()
    server = KVBootstrapServer("127.0.0.1", port)
    sa = DisaggConfig(host="127.0.0.1", disaggregation_bootstrap_port=port, disaggregation_transfer_backend=args.backend, tp_size=1)
    sides = {}
    os.environ["SGLANG_DISAGGREGATION_SAME_HOST_COPY"] = "0"  # pd: Mooncake's data path; copy: its own column
    for mode in (DisaggregationMode.PREFILL, DisaggregationMode.DECODE):
        pool = MHATokenToKVPool(total_pages * ps, ps, dtype, args.kv_heads, args.head_dim, range(args.layers))
        if mode == DisaggregationMode.PREFILL:
            for b in pool.k_buffer + pool.v_buffer:
                b.view(torch.uint8).random_(0, 256) if elem == 1 else b.view(torch.int16 if elem == 2 else torch.int32).random_(0, 1 << 14)
        md = MetadataBuffers(4)
        kv_args = kv_args_from_pools(pool, md, ps)
        mgr = get_kv_class(args.backend, KVClassType.MANAGER)(kv_args, mode, sa)
        sides[mode] = (pool, md, kv_args, mgr)
    (p_pool, p_md, p_args, p_mgr), (d_pool, d_md, d_args, d_mgr) = sides[DisaggregationMode.PREFILL], sides[DisaggregationMode.DECODE]
    Sender, Receiver = get_kv_class(args.backend, KVClassType.SENDER), get_kv_class(args.backend, KVClassType.RECEIVER)
    addr = f"127.0.0.1:{port}"
    rng = np.random.default_rng(0)
    identity = same_host.HostIdentity([(p, n) for p, n in zip(d_args.kv_data_ptrs, d_args.kv_data_lens)])
    writer = same_host.SameHostWriter()
    room = 0
    rows = []
    try:
        for ntok in sizes:
            n_pages = -(-ntok // ps)
            nbytes = n_pages * ps * bytes_per_token
            pd_times, raw_times, batch_times, copy_times = [], [], [], []
            for rep in range(args.repeats + 1):  # first run is a warm-up
                src = pages_for(rng, args.layout, n_pages, total_pages)
                dst = pages_for(rng, args.layout, n_pages, total_pages)
                room += 1
                snd, rcv = Sender(p_mgr, addr, room), Receiver(d_mgr, addr, room)
                rcv.init(0)
                deadline = time.monotonic() + args.timeout
                while rcv.poll() == KVPoll.Bootstrapping and time.monotonic() < deadline:
                    time.sleep(0.001)
                rcv.send_metadata(dst, 0)
                while snd.poll() == KVPoll.Bootstrapping and time.monotonic() < deadline:
                    time.sleep(0.001)
                if snd.poll() != KVPoll.WaitingForInput:
                    raise RuntimeError(f"bootstrap failed for room {room}: state {snd.poll()}")
                p_md.set_buf(0, output_id=room, bootstrap_room=room)
                snd.init(n_pages, aux_index=0)
                t0 = time.perf_counter()
                snd.send(src)
                if wait(rcv, args.timeout) != KVPoll.Success:
                    rcv.failure_exception()
                t_pd = time.perf_counter() - t0
                if rep == args.repeats:  # verify the last run's bytes
                    for pb, db in zip(p_pool.k_buffer + p_pool.v_buffer, d_pool.k_buffer + d_pool.v_buffer):
                        for s_, d_ in ((src[0], dst[0]), (src[-1], dst[-1])):
                            assert torch.equal(pb[s_ * ps : (s_ + 1) * ps], db[d_ * ps : (d_ + 1) * ps]), "transferred bytes differ"
                    assert d_md.get_buf(0).output_id == room
                snd.clear()
                rcv.clear()
                # raw engine: the same bytes, one transfer_sync_write per layer buffer
                engine, session = p_mgr.engine, d_mgr.session_id
                t0 = time.perf_counter()
                for sp, dp_, il in zip(p_args.kv_data_ptrs, d_args.kv_data_ptrs, p_args.kv_item_lens):
                    if engine.transfer_sync(session, sp + il, dp_ + il, n_pages * il) < 0:  # pages 1..n
                        raise RuntimeError("raw transfer_sync_write failed")
                t_raw = time.perf_counter() - t0
                # raw engine, one batch: the same per-buffer blocks in one batch_transfer_sync_write
                t0 = time.perf_counter()
                if engine.batch_transfer_sync(
                    session,
                    [sp + il for sp, il in zip(p_args.kv_data_ptrs, p_args.kv_item_lens)],
                    [dp_ + il for dp_, il in zip(d_args.kv_data_ptrs, p_args.kv_item_lens)],
                    [n_pages * il for il in p_args.kv_item_lens],
                ) < 0:
                    raise RuntimeError("raw batch_transfer_sync_write failed")
                t_batch = time.perf_counter() - t0
                # same-host copy: the same per-buffer blocks in one process_vm_writev
                t0 = time.perf_counter()
                if not writer.write(
                    "bench", same_host.parse_frame(identity.frame()),
                    [sp + il for sp, il in zip(p_args.kv_data_ptrs, p_args.kv_item_lens)],
                    [dp_ + il for dp_, il in zip(d_args.kv_data_ptrs, p_args.kv_item_lens)],
                    [n_pages * il for il in p_args.kv_item_lens],
                ):
                    raise RuntimeError(f"same-host copy refused: {writer.refused}")
                t_copy = time.perf_counter() - t0
                if rep > 0:
                    pd_times.append(t_pd)
                    raw_times.append(t_raw)
                    batch_times.append(t_batch)
                    copy_times.append(t_copy)
                log(
                    f"  {ntok:>7} tokens run {rep}{' (warm-up)' if rep == 0 else ''}: pd {t_pd * 1e3:8.1f} ms, "
                    f"raw {t_raw * 1e3:8.1f} ms, raw batch {t_batch * 1e3:8.1f} ms, copy {t_copy * 1e3:8.1f} ms"
                )
            blocks = len(contiguous_runs(src, dst)[0]) * len(p_args.kv_data_ptrs) + len(p_args.aux_data_ptrs)
            rows.append((ntok, nbytes, blocks, pd_times, raw_times, batch_times, copy_times))
    finally:
        p_mgr.close()
        d_mgr.close()
        server.close()

    gib = 2**30

    def cell(times, nbytes):
        best, med = min(times), float(np.median(times))
        return f"{best * 1e3:>7.1f} / {med * 1e3:>6.1f} {nbytes / best / gib:>6.2f} / {nbytes / med / gib:>5.2f}"

    print(f"\nPD KV transfer ({args.backend}, page_size={ps}, layout={args.layout}, {args.repeats} runs; ms and GiB/s as best / median)")
    print("pd: manager/sender/receiver over Mooncake, send() -> receiver Success; raw: transfer_sync_write per layer "
          "buffer; raw batch: one batch_transfer_sync_write of those buffers; copy: one process_vm_writev of them")
    w = 30
    hdr = (f"{'tokens':>8} {'MiB':>8} {'blocks':>7} | {'pd':^{w}} | {'raw':^{w}} | {'raw batch':^{w}} | {'copy':^{w}} | "
           f"{'pd/raw':>6} {'pd/batch':>8} {'batch/copy':>10}")
    print(hdr)
    print("-" * len(hdr))
    for ntok, nbytes, blocks, pd, raw, batch, copy in rows:
        print(
            f"{ntok:>8} {nbytes / 2**20:>8.1f} {blocks:>7} | {cell(pd, nbytes)} | {cell(raw, nbytes)} | {cell(batch, nbytes)} | "
            f"{cell(copy, nbytes)} | {min(raw) / min(pd):>6.2f} {min(batch) / min(pd):>8.2f} {min(batch) / min(copy):>10.1f}"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
