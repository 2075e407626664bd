"""`LLM(..., tensor_parallel_size=2)` in a script without a main guard (issue 41, item 2).

Every rank's process re-imports the script's main module (multiprocessing's forkserver), so
an unguarded script creates another engine in each rank. Oracle: the script fails with an
error naming the fix (`if __name__ == "__main__":`) instead of waiting for the rendezvous'
5-minute timeout; the same script under the guard generates (a control: the check does not
refuse a guarded script).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BODY = """from hyla import LLM, SamplingParams
{indent}llm = LLM(tensor_parallel_size=2, device="cpu", max_model_len=256, max_num_seqs=4)
{indent}out = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=4))
{indent}print("generated:", len(out[0].outputs[0].token_ids))
"""
GUARD = 'if __name__ == "__main__":'


def _run(tmp_path: Path, guarded: bool) -> subprocess.CompletedProcess:
    body = BODY.format(indent="    " if guarded else "")
    script = body if not guarded else body.replace("from hyla", f"{GUARD}\n    from hyla", 1)
    path = tmp_path / "script.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # the timeout only guards against the old 301 s hang
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=150)  # fmt: skip


def test_unguarded_tp_script_fails_naming_the_guard(tmp_path):
    done = _run(tmp_path, guarded=False)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "ExecutorError" in last and GUARD in last, done.stderr[-3000:]
    assert "generated" not in done.stdout


def test_guarded_tp_script_generates(tmp_path):
    done = _run(tmp_path, guarded=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "generated: 4" in done.stdout
