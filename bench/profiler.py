"""`--profile`: py-spy samples the dispatcher and a worker during scenario 1, summarised into
their top frames for the report (bench/report.py prints them)."""

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import log


class Profiler:
    """`--profile`: py-spy samples the dispatcher (and a worker) during scenario 1's first row."""

    def __init__(self, pids: dict[str, int], outdir: Path):
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            log("--profile: py-spy not found (pip install py-spy); not profiling")
            return
        for name, pid in pids.items():
            out = outdir / f"profile-{name}.raw"
            self.procs[name] = (subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw",
                                                  "--output", str(out), "--nonblocking", "--rate", "200"],
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)

    def stop(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (proc, path) in self.procs.items():
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if path.exists():
                out[name] = summarize_profile(path)
        return out


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        frames = stack.split(";")
        own[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
    return {"samples": total, "file": str(path),
            "self": [(f, round(n / total, 3)) for f, n in own.most_common(top)] if total else [],
            "inclusive": [(f, round(n / total, 3)) for f, n in incl.most_common(top + 25)
                          if not any(s in f for s in ("<module>", "runpy", "click/", "cli.py"))][:top]
            if total else []}
