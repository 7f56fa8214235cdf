#!/usr/bin/env python3
"""CTest splits a test name at ';': a Catch2 TEST_CASE whose name holds one becomes two CTest
entries that select nothing and "pass" in 0 s, so the test silently never runs in CI. Fails
naming every such TEST_CASE."""
import glob
import os
import re
import sys

source = os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
bad = []
for path in sorted(glob.glob(os.path.join(source, "tests", "**", "*.cc"), recursive=True)):
    text = open(path, encoding="utf-8").read()
    # The name is the first argument: one or more adjacent string literals.
    for m in re.finditer(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', text):
        name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
        if ";" in name:
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{os.path.relpath(path, source)}:{line}: {name}")
if bad:
    print("TEST_CASE names with ';' (CTest would split them and run nothing):")
    print("\n".join(bad))
    sys.exit(1)
print("no TEST_CASE name holds ';'")
