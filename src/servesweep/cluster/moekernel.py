"""The MoE kernel smoke of build_images: each MoE runner the run chooses runs once on a node's
GPU through SGLang's own entry point, `python -m sglang.benchmark.one_batch` (before that
module existed: `sglang.bench_one_batch`): one prefill batch through the model as SGLang builds
it, its MoE layers on the chosen `--moe-runner-backend`, on dummy weights (`--load-format
dummy`) of the model cut to `runtime.moe_smoke_layers` layers. A kernel missing for the GPU
(e.g. SM120) fails here with a named line, not at the first start. Where no GPU is visible
(CI), nothing runs and the evidence says so."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from servesweep.config.experiment import Experiment
from servesweep.config.matrix import server_specs

FAILED = "MOE KERNEL FAILED"

# Run SGLang's one-batch benchmark with the given arguments when nvidia-smi lists a GPU; the
# last line is the evidence as JSON, or `MOE KERNEL FAILED: <runner> on <GPU> (sm<cc>): ...`
# (exit 1).
PROBE = """import importlib.util, json, shutil, subprocess, sys
backend, args = sys.argv[1], sys.argv[2:]


def smi(query):
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    r = subprocess.run([exe, "--query-gpu=" + query, "--format=csv,noheader"],
                       capture_output=True, text=True)
    return [x.strip() for x in r.stdout.splitlines() if x.strip()] if r.returncode == 0 else []


rows = smi("name,compute_cap")
gpu = {"gpu": rows[0].rpartition(",")[0].strip(),
       "sm": "sm" + rows[0].rpartition(",")[2].strip().replace(".", "")} if rows else None
if gpu is None and smi("name"):
    gpu = {"gpu": smi("name")[0], "sm": "sm?"}
if gpu is None:
    print(json.dumps({"backend": backend, "ran": False, "gpu": None,
                      "reason": "no GPU visible (nvidia-smi absent or lists none): not run"}))
    sys.exit(0)
try:  # SGLang >= 0.5.2x: sglang.benchmark.one_batch; before: sglang.bench_one_batch
    new = importlib.util.find_spec("sglang.benchmark.one_batch") is not None
except ModuleNotFoundError:
    new = False
module = "sglang.benchmark.one_batch" if new else "sglang.bench_one_batch"
r = subprocess.run([sys.executable, "-m", module, *args],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
print("\\n".join(r.stdout.splitlines()[-40:]))
# With TP > 1 a rank that dies leaves the parent's exit 0: rank 0's prefill line is the proof.
if r.returncode != 0 or "Prefill. latency:" not in r.stdout:
    print(f"MOE KERNEL FAILED: {backend} on {gpu['gpu']} ({gpu['sm']}): exit {r.returncode}"
          + ("" if r.returncode else ", no prefill batch ran"))
    sys.exit(1)
print(json.dumps({"backend": backend, "ran": True, "module": module, **gpu}))
"""


@dataclass(frozen=True)
class KernelRun:
    """One MoE runner's smoke: the runner and the shell command run in the image."""

    backend: str
    command: str


def kernel_runs(exp: Experiment) -> list[KernelRun]:
    """One run per MoE runner the run's server configs choose (every role), at the first
    role's TP/EP that chooses it, cut to one node's GPUs; [] without runtime.moe_smoke_layers
    or for the sim (it has no GPU kernel)."""
    layers = exp.runtime.moe_smoke_layers
    if layers is None or exp.engine.kind != "sglang":
        return []
    chosen = {}
    for spec in server_specs(exp):
        for role in spec.roles:
            if role.args.moe_runner_backend:
                chosen.setdefault(role.args.moe_runner_backend, role.args)
    out = []
    for backend, args in chosen.items():
        tp = min(args.tp_size, exp.cluster.gpus_per_node)
        ep = min(args.ep_size, tp)
        argv = [
            "--model-path",
            exp.engine.model_path,
            "--load-format",
            "dummy",
            "--json-model-override-args",
            json.dumps({"num_hidden_layers": layers}),
            "--tp-size",
            str(tp),
            *(["--ep-size", str(ep)] if ep > 1 else []),
            "--moe-runner-backend",
            backend,
            *(["--trust-remote-code"] if args.trust_remote_code else []),
            "--batch-size",
            "1",
            "--input-len",
            "128",
            "--output-len",
            "1",
        ]
        command = f"{exp.engine.python} -c {shlex.quote(PROBE)} {shlex.quote(backend)} "
        out.append(KernelRun(backend, command + shlex.join(argv)))
    return out


def verdict(output: str) -> dict[str, Any] | None:
    """The evidence of a run that passed (its last line), or None."""
    last = (output.splitlines() or [""])[-1]
    try:
        found = json.loads(last)
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None
