#!/usr/bin/env python3
"""Clang's thread-safety analysis over the annotated translation units of the build.

Tandem marks what a lock guards with the annotations of common/base/thread_annotations.h. GCC
ignores them; this check parses, with clang++ -fsyntax-only -Wthread-safety -Werror, every source
file of the build (compile_commands.json) that includes thread_annotations.h itself or whose
header beside it does, so that a member read without its lock, or a lock annotation on a type
that is not a capability, fails the test suite.

Usage: thread_safety.py BUILD_DIR  (exit 0 = clean, 1 = findings, 77 = no clang++)
"""
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys


def clang_command(entry, clang):
    args = shlex.split(entry["command"])
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = True
            continue
        if a.startswith("-O") or a == "-g" or a.startswith("-Wno-restrict"):
            continue
        out.append(a)
    return out + ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                  "-Wno-unknown-warning-option", entry["file"]]


def annotated(path):
    if not path.endswith(".cc"):
        return False
    for candidate in (path, path[:-3] + ".h"):
        try:
            with open(candidate, encoding="utf-8") as f:
                if "common/base/thread_annotations.h" in f.read():
                    return True
        except OSError:
            pass
    return False


SELF_TEST = """
#include "common/base/thread_annotations.h"
struct Counter {
  tandem::Mutex mu;
  int value TANDEM_GUARDED_BY(mu) = 0;
  int Unlocked() { return value; }  // must be reported
};
"""


def analysis_catches_a_race(clang, source_dir):
    """The analysis is on: a read without the lock is reported."""
    p = subprocess.run([clang, "-std=c++20", "-I", source_dir, "-fsyntax-only", "-Wthread-safety",
                        "-Werror=thread-safety", "-x", "c++", "-"],
                       input=SELF_TEST, capture_output=True, text=True)
    return p.returncode != 0 and "requires holding mutex" in p.stderr


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    if not clang:
        print("skipped: clang++ not found (apt-get install clang)")
        return 77
    source_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not analysis_catches_a_race(clang, source_dir):
        print("the analysis did not report an unguarded read in the self-test snippet")
        return 1
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = [e for e in json.load(f) if annotated(e["file"])]
    def run(entry):
        p = subprocess.run(clang_command(entry, clang), cwd=entry["directory"],
                           capture_output=True, text=True)
        return entry["file"], p.returncode, p.stderr
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for path, rc, err in pool.map(run, entries):
            if rc != 0:
                failed += 1
                print(f"--- {path}\n{err}")
    print(f"thread-safety analysis: {len(entries)} translation units, {failed} with findings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
