#!/usr/bin/env python
"""The fuzzer's command line (see tests/fuzz/__init__.py):

    python tests/fuzz/run.py                                # 10,000 calls, seed 0
    python tests/fuzz/run.py --calls 2000 --seed 7 --json fuzz.json
    python tests/fuzz/run.py --replay 0:1234                # call 1234 of seed 0, in-process
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

from fuzz.driver import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
