"""`make bench`: run every benchmark script in this folder in turn, printing their tables (for docs/benchmarks.md)."""

import subprocess
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
failed = []
for script in sorted(here.glob("bench_*.py")):
    print(f"\n## {script.name}\n", flush=True)
    if subprocess.run([sys.executable, str(script)], cwd=here.parent).returncode:
        failed.append(script.name)
sys.exit(f"failed: {', '.join(failed)}" if failed else 0)
