// What the fuzz targets share: FUZZ_CHECK, a property that must hold for every input. A failed
// check prints what broke and aborts, so libFuzzer saves the input as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, what)                                                         \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s (%s)\n", __FILE__, __LINE__, \
                   #cond, what);                                                       \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)
