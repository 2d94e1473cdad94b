#!/usr/bin/env bash
# Usage: scripts/gpu-suite.sh
# On a build machine (with cargo): builds, then gathers into the ignored
# folder gpu-suite/ what the GPU machine needs (capi_tests/gpu/make-gpu-suite.sh:
# the release libraries, tc-run, tc-perf, the header, the GPU tests and
# benchmark sources, run.sh). On the GPU machine, from the repository root,
# with no cargo or make: `bash gpu-suite/run.sh` (part 1, under 9 minutes),
# `bash gpu-suite/run.sh part2`, `bash gpu-suite/run.sh list`; see
# docs/gpu-testing.md.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
exec bash capi_tests/gpu/make-gpu-suite.sh "$ROOT/gpu-suite"
