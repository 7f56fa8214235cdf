#!/usr/bin/env python3
"""The shape of the code: no C++ or CUDA source file (.h, .cc, .cu) in the repository is over
800 lines (STYLE.md: files split by concern before they grow past that), and no function in them
is over 120 lines (a command is parse -> run -> report; a step is named parts). Function lengths
come from lizard (PyPI, pinned in deploy/requirements.txt), from the first to the last line of
the function. Fails listing every file and function over its limit, longest first.

Build trees (any folder holding a CMakeCache.txt) and hidden folders (.git, .venv, ...) are not
the repository's sources and are skipped."""
import os
import sys

import lizard

MAX_LINES = 800
MAX_FUNCTION_LINES = 120
EXTENSIONS = (".h", ".cc", ".cu")

source = os.path.abspath(
    os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))


def source_files(root):
    for folder, subfolders, files in os.walk(root):
        # Pruning in place keeps os.walk out of build trees and hidden folders.
        subfolders[:] = sorted(
            d for d in subfolders
            if not d.startswith(".")
            and not os.path.exists(os.path.join(folder, d, "CMakeCache.txt")))
        for name in sorted(files):
            if name.endswith(EXTENSIONS):
                yield os.path.join(folder, name)


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


checked = 0
too_long = []
long_functions = []
for path in source_files(source):
    checked += 1
    lines = count_lines(path)
    if lines > MAX_LINES:
        too_long.append((lines, os.path.relpath(path, source)))
    for function in lizard.analyze_file(path).function_list:
        if function.length > MAX_FUNCTION_LINES:
            long_functions.append((function.length, f"{os.path.relpath(path, source)}:"
                                   f"{function.start_line} {function.name}"))

if checked == 0:
    print(f"no .h/.cc/.cu files under {source}: wrong TANDEM_SOURCE_DIR?")
    sys.exit(1)
if too_long:
    print(f"{len(too_long)} source file(s) over {MAX_LINES} lines (split them by concern):")
    for lines, path in sorted(too_long, reverse=True):
        print(f"  {path}: {lines} lines")
if long_functions:
    print(f"{len(long_functions)} function(s) over {MAX_FUNCTION_LINES} lines (name their parts):")
    for lines, where in sorted(long_functions, reverse=True):
        print(f"  {where}: {lines} lines")
if too_long or long_functions:
    sys.exit(1)
print(f"{checked} source files, none over {MAX_LINES} lines, no function over "
      f"{MAX_FUNCTION_LINES} lines")
