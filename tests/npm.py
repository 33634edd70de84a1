"""Packages from npm that tests run (a peer's client, a browser tool): installed once per folder
from its package-lock.json (`npm ci`, so the versions are the pinned ones), shared by every
test process."""

import fcntl
import subprocess
from pathlib import Path


def installed(folder: Path, package: str) -> Path:
    """`folder` (which holds a package.json and its package-lock.json) with its packages
    installed; `package` is one of them, whose presence says the install is done."""
    done = folder / "node_modules" / package / "package.json"
    if not done.exists():
        with open(folder / ".install.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # xdist's processes: one installs, the others wait
            if not done.exists():
                subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=folder, check=True,
                               timeout=300)
    return folder
