"""The worker of tests/test_forkserver.py: ``python -m tests.forkserver_probe exit N [ARGS...]`` prints one JSON
line of what it was started with and what it holds, then exits N; ``… sleep S`` sleeps S seconds (SIGTERM ends it)."""

import json
import os
import sys
import time

if __name__ == "__main__":
    preloaded = "torch" in sys.modules  # before this module imports anything heavy
    import torch

    if sys.argv[1] == "sleep":
        time.sleep(float(sys.argv[2]))
        sys.exit(0)
    print(json.dumps({
        "argv": sys.argv[1:], "name": __name__, "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
        "supervisor": os.getppid(), "session": os.getsid(0), "threads": len(os.listdir("/proc/self/task")),
        "cuda_initialized": torch.cuda.is_initialized(), "preloaded": preloaded,
    }), flush=True)
    sys.exit(int(sys.argv[2]))
