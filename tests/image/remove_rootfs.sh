#!/usr/bin/env bash
# CTest fixture cleanup of `tandem_image` (test image/cleanup): removes the exported root
# filesystem once every test that needed it has run (the disk is small; the base tarball stays).
set -euo pipefail
work="$1/image"
rm -rf "$work/rootfs" "$work/rootfs.path"
