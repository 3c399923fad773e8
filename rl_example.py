"""Entry point of the default job. The distributed driver is not built yet; this says so instead of pretending."""

import sys

if __name__ == "__main__":
    print("rl_example.py: launch_distributed is not built yet; see README.md (Status).", file=sys.stderr)
    sys.exit(2)
