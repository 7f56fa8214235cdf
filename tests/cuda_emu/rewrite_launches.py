#!/usr/bin/env python3
"""Turns a .cu file into C++ for the CUDA emulator (tests/cuda_emu/include/cuda_emu.h).

    rewrite_launches.py IN.cu OUT.cc

Each kernel launch `Kernel<T><<<grid, block, shared, stream>>>(a, b);` becomes
`::cuda_emu::Launch(grid, block, shared, stream, Kernel<T>, a, b);`, and the file starts with
the emulator's header. Everything else is left as it is: the emulator's headers stand in for
CUDA's. A `<<<` it cannot parse (no kernel name before it, no `>>>(...)` after) fails the build.
"""
import re
import sys


def matching(text, start, open_char, close_char):
    """Index just past the bracket that closes the one at `start`."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == open_char:
            depth += 1
        elif c == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced %s at offset %d" % (open_char, start))


def split_top_level(text):
    """`a, f(b, c), d` -> ['a', 'f(b, c)', 'd']: commas outside brackets."""
    parts, depth, current = [], 0, ""
    for c in text:
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += c
    parts.append(current.strip())
    return parts


def kernel_start(text, launch):
    """Where the kernel expression before `<<<` at `launch` begins: an identifier with optional
    template arguments (`Kernel<In, Out>`)."""
    i = launch
    if text[i - 1] == ">":  # template arguments: walk back to their '<'
        depth = 0
        while i > 0:
            i -= 1
            if text[i] == ">":
                depth += 1
            elif text[i] == "<":
                depth -= 1
                if depth == 0:
                    break
    m = re.search(r"[A-Za-z_][A-Za-z_0-9:]*$", text[:i])
    if not m:
        raise ValueError("no kernel name before <<< at offset %d" % launch)
    return m.start()


def rewrite(text):
    out = []
    pos = 0
    while True:
        launch = text.find("<<<", pos)
        if launch < 0:
            out.append(text[pos:])
            break
        start = kernel_start(text, launch)
        config_end = text.find(">>>", launch)
        if config_end < 0:
            raise ValueError("no >>> after <<< at offset %d" % launch)
        args_open = config_end + 3
        while text[args_open].isspace():
            args_open += 1
        if text[args_open] != "(":
            raise ValueError("no argument list after >>> at offset %d" % config_end)
        args_close = matching(text, args_open, "(", ")")
        kernel = text[start:launch].strip()
        config = split_top_level(text[launch + 3:config_end])
        if not 2 <= len(config) <= 4:
            raise ValueError("<<<%s>>>: 2 to 4 launch parameters expected" % ", ".join(config))
        config += ["0", "nullptr"][len(config) - 2:]
        args = text[args_open + 1:args_close - 1].strip()
        out.append(text[pos:start])
        out.append("::cuda_emu::Launch(%s, %s%s)" % (", ".join(config), kernel,
                                                     ", " + args if args else ""))
        pos = args_close
    return "".join(out)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, target = sys.argv[1], sys.argv[2]
    with open(source) as f:
        text = f.read()
    try:
        body = rewrite(text)
    except ValueError as e:
        sys.exit("%s: %s" % (source, e))
    with open(target, "w") as f:
        f.write("// Generated from %s by tests/cuda_emu/rewrite_launches.py: do not edit.\n"
                % source)
        f.write('#include "cuda_emu.h"\n#line 1 "%s"\n' % source)
        f.write(body)


if __name__ == "__main__":
    main()
