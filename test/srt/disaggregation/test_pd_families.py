"""Gemma 2, Gemma 3 (hybrid sliding-window layers), Phi-3 and DeepSeek-V3 (MLA: the transfer and
the host pool move one latent per token) served by `python -m sglang.launch_pd` behind the real router, the decode server short of KV so that it retracts to the host pool
(launch_pd's default backup): every request still gets HF's greedy tokens, some were retracted,
and afterwards both servers' pools are whole."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang.test.family_parity import family_dir, family_hf
from sglang.test.fuzz.runner import assert_pools_restored
from sglang.test.hf_reference import hf_greedy
from sglang.test.scheduler_utils import random_prompts
from sglang.test.server_utils import find_free_port, wait_for_health

pytestmark = pytest.mark.server


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "phi3", "deepseek_v3"])
def test_launch_pd_host_pool_retraction(arch, tmp_path):
    pytest.importorskip("sglang_router")
    ports = [find_free_port() for _ in range(4)]
    log_path = tmp_path / "pd.log"
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_pd", "--model-path", family_dir(arch),
                             "--port", str(ports[0]), "--prefill-port", str(ports[1]), "--decode-port", str(ports[2]),
                             "--bootstrap-port", str(ports[3]), "--", "--max-total-tokens", "320",
                             "--num-reserved-decode-tokens", "8", "--dtype", "float32"],
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    router = f"http://127.0.0.1:{ports[0]}"
    try:
        wait_for_health(router, timeout=300, process=proc)
        prompts = random_prompts([40] * 8, seed=21)

        def generate(p):
            r = requests.post(router + "/generate", timeout=300, json={
                "input_ids": p, "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}})
            assert r.status_code == 200, r.text
            return r.json()

        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(generate, prompts))
        hf = family_hf(arch)
        for out, p in zip(outs, prompts):
            assert out["output_ids"] == hf_greedy(hf, p, 40)
        assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
        assert_pools_restored([f"http://127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[2]}"])
    except BaseException:
        print(log_path.read_text()[-6000:])
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
