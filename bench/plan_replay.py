"""Time the engine's plan on a snapshot saved from a real operator, against another commit's code.

    GPUEFF_PROBE_SAVE_PLANS=DIR python bench/scale/probe.py TRACE.jsonl run ...   # saves DIR/plan-N.pkl
    python bench/plan_replay.py DIR/plan-4.pkl [--repeat 7] [--against ROOT] [--steady]

A saved plan is the cycle's own input: the snapshot (pods, nodes, GPU samples with the windows the
tiered source carried) and the policy's memory as the previous cycle left it (the judge memo and
the idle ledger). Each repeat loads it afresh and times ``engine.plan`` with the cyclic GC paused,
as the cycle runs it, so the figure is one real steady plan, free of the noise of a 2-core machine
that also runs Prometheus and the cluster (bench/scale/RESULTS.md). The digest names the plan made
(verdicts, actions, status and notes): the same digest on two commits is the same plan.

``--steady`` times the cycle after it instead, with nothing changed: each repeat plans the saved
snapshot twice with a fresh judge memo (the first judges every carried window, the second keeps
those verdicts and learns which pods are quiet), then times a third plan of the same snapshot, as a
cycle whose pods and windows did not move runs it. It needs only the saved snapshot and idle ledger,
so it also compares commits whose memo keeps different things.

``--against ROOT`` runs the same file under the code of another checkout (a ``git worktree``) in the
same run and prints both and their ratio. Both must unpickle the saved classes: a commit that
changed them cannot read the other's files.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def digest(plan: Any) -> str:
    """Names the plan made (verdicts, actions, status and notes): equal digests, equal plans."""
    made = repr((plan.verdicts, plan.actions, plan.status, plan.notes)).encode()
    return hashlib.sha256(made).hexdigest()[:16]


def replay(path: Path, repeat: int, steady: bool = False) -> dict[str, Any]:
    """Plan the saved cycle ``repeat`` times (``steady``: the unchanged cycle after it); its times,
    size and digest."""
    from gpu_efficiency import engine
    from gpu_efficiency.engine.reclaim.judgememo import JudgeMemo

    times: list[float] = []
    plan: Any = None
    memory: Any = None
    for _ in range(repeat):
        with path.open("rb") as saved:
            snapshot, memory = pickle.load(saved)
        if steady:
            memory.memo = JudgeMemo()
            for _ in range(2):
                engine.plan(snapshot, memory)
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            _, plan = engine.plan(snapshot, memory)
            times.append(time.perf_counter() - started)
        finally:
            gc.enable()
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "verdicts": len(plan.verdicts),
        "actions": len(plan.actions),
        "kept": memory.memo.hits,
        "judged": memory.memo.misses,
        "quiet": getattr(memory.memo, "quiet", 0),  # 0 where the memo does not keep quiet pods
        "digest": digest(plan),
        "code": str(Path(engine.__file__).parents[2]),
    }


def _line(label: str, result: dict[str, Any]) -> str:
    return (
        f"{label}: plan median {result['median_s']:.3f} s (min {result['min_s']:.3f}, max "
        f"{result['max_s']:.3f}); {result['verdicts']} verdicts ({result['kept']} kept, "
        f"{result['judged']} judged), {result['quiet']} quiet pods not acted on, {result['actions']} "
        f"actions; digest {result['digest']} "
        f"(code from {result['code']})"
    )


def _against(root: Path, path: Path, repeat: int, steady: bool) -> dict[str, Any]:
    """The same replay under another checkout's code, in a child process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / d) for d in ("operator", "harness"))}
    done = subprocess.run(
        [sys.executable, __file__, str(path), "--repeat", str(repeat), "--json"]
        + (["--steady"] if steady else []),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("saved", type=Path, help="a plan-N.pkl saved by probe.py")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another checkout, timed in the same run")
    parser.add_argument("--steady", action="store_true", help="time the unchanged cycle after the saved one")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = replay(args.saved, args.repeat, args.steady)
    if args.json:
        print(json.dumps(result))
        return 0
    print(_line("this checkout", result))
    if args.against is not None:
        other = _against(args.against, args.saved, args.repeat, args.steady)
        print(_line(str(args.against), other))
        same = "the same plan" if other["digest"] == result["digest"] else "DIFFERENT plans"
        print(f"ratio (this / other, medians): {result['median_s'] / other['median_s']:.2f}; {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
